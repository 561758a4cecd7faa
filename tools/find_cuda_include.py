"""Print the directory holding cuda.h: $CUDA_HOME/include, else the nvidia-cuda-runtime wheel."""
import os
import sys


def main():
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "include"))
    try:
        import nvidia  # namespace package from the nvidia-cuda-runtime wheel
        for root in nvidia.__path__:
            for sub in ("cu13", "cu12", "cuda_runtime"):
                candidates.append(os.path.join(root, sub, "include"))
    except ImportError:
        pass
    candidates.append("/usr/local/cuda/include")
    for c in candidates:
        if os.path.exists(os.path.join(c, "cuda.h")):
            print(c)
            return 0
    sys.stderr.write("cuda.h not found: set CUDA_HOME or pip install nvidia-cuda-runtime\n")
    return 1


sys.exit(main())
