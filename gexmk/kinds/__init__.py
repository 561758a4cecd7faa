"""Memory kinds (GASNet-EX ``gex_MK_t`` classes): one module per kind, each
filling the ``gx_kind_ops`` table of ``gexmk/kinds/kind.pxd``.

``gexmk.kinds.cuda`` is the CUDA_UVA kind (and the CUDA driver probe); it
imports on machines without a GPU and reports what is missing when used.
"""
