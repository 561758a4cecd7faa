"""The preflight probes: libfabric providers and FI_HMEM_CUDA registration
(gexmk.fabric_probe), the CUDA driver (gexmk.kinds.cuda), and ``python -m gexmk.info``."""
import errno
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from gexmk import info
from gexmk.kinds import cuda
from gexmk.errors import GexmkError, OFIError, UnsupportedError



def _libfabric_dev_installed():
    if shutil.which("pkg-config"):
        return subprocess.run(["pkg-config", "--exists", "libfabric"]).returncode == 0
    return os.path.exists("/usr/include/rdma/fabric.h")


try:
    from gexmk import fabric_probe as ofi
except ImportError:
    # Only a machine without libfabric's headers may lack the module; where
    # it could have been built, a missing gexmk.fabric_probe must fail loudly.
    if _libfabric_dev_installed():
        raise
    ofi = None
needs_ofi = pytest.mark.skipif(ofi is None, reason="libfabric (headers) not installed")

CUDA = cuda.probe()
needs_no_gpu = pytest.mark.skipif(CUDA["available"], reason="a CUDA device is present")
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not CUDA["available"], reason=str(CUDA.get("reason")))


# ---------------------------------------------------------------------------
# gexmk.fabric_probe
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def providers():
    if ofi is None:
        pytest.skip("libfabric is not installed")
    return ofi.providers()


@needs_ofi
def test_version_is_runtime_major_minor():
    assert re.fullmatch(r"\d+\.\d+", ofi.version())
    assert re.fullmatch(r"\d+\.\d+\.\d+", ofi.HEADER_VERSION)


@needs_ofi
def test_tcp_and_a_local_provider_offer_rma(providers):
    names = {p["provider"] for p in providers}
    assert any(n == "tcp" or n.startswith("tcp;") for n in names), names
    assert names & {"shm", "sockets"}, names
    for p in providers:
        assert "FI_RMA" in p["caps"]
        assert isinstance(p["atomic"], bool) and isinstance(p["hmem_caps"], bool)
        assert p["data_progress"] in ("FI_PROGRESS_AUTO", "FI_PROGRESS_MANUAL")
        assert isinstance(p["mr_mode"], list)
        assert p["inject_size"] >= 0 and p["max_msg_size"] > 0


@needs_ofi
def test_tcp_offers_atomics(providers):
    tcp = [p for p in providers if p["provider"].startswith("tcp")]
    assert any(p["atomic"] for p in tcp)


@needs_ofi
def test_provider_filter(providers):
    shm = ofi.providers("shm")
    assert shm and {p["provider"] for p in shm} == {"shm"}
    assert {p["provider"] for p in ofi.providers("tcp")} <= {"tcp", "tcp;ofi_rxm"}


@needs_ofi
def test_unknown_provider_gives_empty_list():
    assert ofi.providers("no-such-provider") == []


@needs_ofi
def test_failing_call_raises_ofierror_with_fi_strerror_text():
    # An API version newer than the library: fi_getinfo returns -FI_ENOSYS.
    with pytest.raises(OFIError) as excinfo:
        ofi.providers(api_version=(99, 0))
    e = excinfo.value
    assert isinstance(e, GexmkError)
    assert e.call == "fi_getinfo"
    assert e.code == errno.ENOSYS
    assert ofi.strerror(e.code) == os.strerror(errno.ENOSYS)
    assert ofi.strerror(e.code) in str(e) and "fi_getinfo" in str(e)


@needs_ofi
def test_bad_arguments_are_rejected_with_a_sentence():
    with pytest.raises(TypeError, match="prov_name must be a str"):
        ofi.providers(42)
    with pytest.raises(TypeError, match="api_version must be"):
        ofi.providers(api_version="1.17")
    with pytest.raises(ValueError, match="out of range"):
        ofi.providers(api_version=(-1, 0))
    with pytest.raises(ValueError, match="nbytes"):
        ofi.hmem_cuda_registration("shm", ptr=0x1000, nbytes=0)


@needs_ofi
def test_hmem_cuda_not_read_from_caps_but_tried(providers):
    # Debian's libfabric lists FI_HMEM for shm yet has no CUDA support: the
    # probe must get past fi_getinfo and be refused by fi_mr_regattr.
    if not any(p["provider"] == "shm" and p["hmem_caps"] for p in providers):
        pytest.skip("shm offers no FI_HMEM endpoint here")
    res = ofi.hmem_cuda_registration("shm")
    if res["supported"]:
        pytest.skip("this libfabric registers CUDA memory")
    assert res["supported"] is False or (res["supported"] is None
                                         and res["tested_with"] == "host pointer")
    assert res["call"] == "fi_mr_regattr"
    assert res["reason"]
    if not CUDA["available"]:
        assert res["code"] == errno.ENOSYS
        assert "Function not implemented" in res["reason"]


@needs_ofi
def test_hmem_cuda_without_hmem_provider_is_a_reported_no():
    for name in ("tcp", "no-such-provider"):
        res = ofi.hmem_cuda_registration(name)
        assert res["supported"] is False
        assert res["call"] == "fi_getinfo" and res["code"] == errno.ENODATA
        assert name in res["reason"]


# ---------------------------------------------------------------------------
# gexmk.kinds.cuda
# ---------------------------------------------------------------------------
@needs_no_gpu
def test_cuda_probe_reports_unsupported_without_a_gpu():
    res = cuda.probe()
    assert res["available"] is False
    assert res["reason"].startswith("CUDA kind unsupported on this machine: ")
    assert res["devices"] == [] and res["device_count"] == 0


@needs_no_gpu
def test_device_buffer_without_a_gpu_raises_unsupported():
    with pytest.raises(UnsupportedError, match="CUDA kind unsupported"):
        cuda.DeviceBuffer(4096)


@gpu
@needs_gpu
def test_cuda_probe_describes_devices():
    res = cuda.probe()
    assert res["driver_loaded"] and res["device_count"] == len(res["devices"]) >= 1
    d = res["devices"][0]
    assert d["total_memory"] > 0 and re.fullmatch(r"\d+\.\d+", d["compute_capability"])
    assert isinstance(d["vmm"], bool) and isinstance(d["posix_fd_handle"], bool)
    n = res["device_count"]
    assert len(res["peer_access"]) == n and all(len(r) == n for r in res["peer_access"])


@gpu
@needs_gpu
def test_device_buffer_lifetime():
    with cuda.DeviceBuffer(1 << 16) as buf:
        assert buf.ptr != 0 and buf.nbytes == 1 << 16 and buf.device == 0
    assert buf.ptr == 0
    buf.close()  # idempotent
    with pytest.raises(ValueError, match="nbytes"):
        cuda.DeviceBuffer(0)


@gpu
@needs_gpu
@needs_ofi
def test_hmem_cuda_registration_with_a_device_pointer():
    with cuda.DeviceBuffer(1 << 16) as buf:
        for name in {p["provider"] for p in ofi.providers()}:
            res = ofi.hmem_cuda_registration(name, ptr=buf.ptr, nbytes=buf.nbytes,
                                             device=buf.device)
            assert res["supported"] in (True, False), res
            assert res["tested_with"] == "device pointer"


# ---------------------------------------------------------------------------
# gexmk.info
# ---------------------------------------------------------------------------
def _run_info(*args):
    # -P: the source tree (no compiled modules) must not shadow the build under test
    return subprocess.run([sys.executable, "-P", "-m", "gexmk.info", *args], capture_output=True,
                          text=True, timeout=120)


def test_info_json_cli_prints_valid_json():
    proc = _run_info("--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert {"gexmk", "python", "numpy", "libfabric", "cuda", "ptrace_scope", "memfd",
            "cpus"} <= rep.keys()
    if ofi is not None:
        assert rep["libfabric"]["providers"]
        assert rep["libfabric"]["hmem_cuda"]
    assert rep["cuda"]["available"] == CUDA["available"]
    assert rep["memfd"]["supported"] is True
    assert rep["cpus"]["count"] >= 1


def test_info_text_cli():
    proc = _run_info()
    assert proc.returncode == 0, proc.stderr
    assert "libfabric" in proc.stdout and "CUDA" in proc.stdout
    if ofi is not None:
        assert "FI_HMEM_CUDA" in proc.stdout


def test_report_survives_a_module_that_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "gexmk.fabric_probe", None)   # import now fails
    monkeypatch.setitem(sys.modules, "gexmk.kinds.cuda", None)
    rep = info.report()
    assert "did not import" in rep["libfabric"]["error"]
    assert "did not import" in rep["cuda"]["error"]
    json.dumps(rep)
    assert "error" in info._format(rep)


# ---------------------------------------------------------------------------
# lib/libfabric.pxd against the real headers
# ---------------------------------------------------------------------------
def _declcheck_source(pxd_text):
    """A Cython module that touches every declaration of libfabric.pxd: a
    typed pointer to every struct field, every constant, and a call of every
    function with arguments of the declared types, so that the C compiler
    checks each against <rdma/*.h>."""
    structs, funcs, consts, enums = {}, [], [], []
    cur, in_block = None, False
    for line in pxd_text.splitlines():
        if line.startswith("cdef extern"):
            in_block, cur = True, None
            continue
        code = line.split("#")[0].rstrip()
        if not in_block or not code.strip():
            continue
        indent, t = len(code) - len(code.lstrip()), code.strip()
        if indent == 4:
            cur = None
            if m := re.match(r'(?:struct|union) (\w+)(?: "[^"]*")?:$', t):
                cur = m.group(1)
                structs[cur] = []
            elif re.match(r"enum( \w+)?:$", t):
                cur = "<enum>"
            elif re.match(r"(struct|union) \w+$", t) or t.startswith("ctypedef"):
                pass
            elif m := re.match(r"const (\w+) (\w+)$", t):
                consts.append(m.groups())
            elif m := re.match(r"(.+?)\b(\w+)\((.*)\)$", t):
                args = [re.match(r"(.+?)\s*\b(\w+)$", a.strip()).group(1)
                        for a in m.group(3).split(",") if a.strip()]
                funcs.append((m.group(1).strip(), m.group(2), args))
            else:
                raise AssertionError(f"declcheck cannot parse: {t}")
        elif cur == "<enum>":
            enums.append(t)
        elif cur:
            m = re.match(r"(.+?)\s*\b(\w+)(\[\d+\])?$", t)
            structs[cur].append(m.groups())
    unions = {n for n in structs if n.startswith("_")}
    out = ["from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t",
           "from posix.uio cimport iovec",
           "from gexmk.lib.libfabric cimport *",
           "cdef void fields() noexcept nogil:"]
    for k, (name, fields) in enumerate(structs.items()):
        if name in unions:
            continue
        out.append(f"    cdef {name} s{k}")
        for ftype, fname, array in fields:
            if array:
                out.append(f"    cdef {ftype} a{k}_{fname} = s{k}.{fname}[0]")
            elif ftype in unions:
                for utype, uname, _ in structs[ftype]:
                    out.append(f"    cdef {utype}* p{k}_{fname}_{uname} = &s{k}.{fname}.{uname}")
            else:
                out.append(f"    cdef {ftype}* p{k}_{fname} = &s{k}.{fname}")
    out.append("cdef void constants() noexcept nogil:")
    out += [f"    cdef {ctype} c{i} = {name}" for i, (ctype, name) in enumerate(consts)]
    out += [f"    cdef long e{i} = {name}" for i, name in enumerate(enums)]
    out.append("cdef void calls() noexcept nogil:")
    for i, (ret, name, args) in enumerate(funcs):
        out += [f"    cdef {a} x{i}_{j}" for j, a in enumerate(args)]
        call = f"{name}({', '.join(f'x{i}_{j}' for j in range(len(args)))})"
        out.append(f"    {call}" if ret == "void" else f"    cdef {ret} r{i} = {call}")
    return "\n".join(out) + "\n", len(funcs)


@needs_ofi
def test_libfabric_pxd_matches_headers(tmp_path):
    import gexmk
    root = os.path.dirname(os.path.dirname(os.path.abspath(gexmk.__file__)))
    pxd = os.path.join(root, "gexmk", "lib", "libfabric.pxd")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not os.path.exists(pxd) or not cc or not shutil.which("cython"):
        pytest.skip("needs the gexmk sources, cython and a C compiler")
    if not os.path.exists("/usr/include/rdma/fabric.h"):
        pytest.skip("needs the libfabric headers")
    with open(pxd) as f:
        source, nfuncs = _declcheck_source(f.read())
    assert nfuncs > 80
    pyx = tmp_path / "declcheck.pyx"
    pyx.write_text(source)
    subprocess.run(["cython", "-3", "-I", root, str(pyx), "-o", str(tmp_path / "d.c")],
                   check=True, capture_output=True, timeout=120)
    import sysconfig
    proc = subprocess.run(
        [cc, "-fsyntax-only", "-I", sysconfig.get_paths()["include"],
         "-Werror=incompatible-pointer-types", "-Werror=pointer-sign",
         "-Werror=int-conversion", "-Werror=implicit-function-declaration",
         "-Werror=discarded-qualifiers", str(tmp_path / "d.c")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
