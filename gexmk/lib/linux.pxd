# Declarations only: the Linux calls gexmk needs beyond libc's cimports.
from posix.types cimport pid_t

cdef extern from "<sys/mman.h>" nogil:
    int memfd_create(const char* name, unsigned int flags)
    enum:
        MFD_CLOEXEC

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void* iov_base
        size_t iov_len
    ssize_t process_vm_readv(pid_t pid, const iovec* local_iov, unsigned long liovcnt,
                             const iovec* remote_iov, unsigned long riovcnt, unsigned long flags)
    ssize_t process_vm_writev(pid_t pid, const iovec* local_iov, unsigned long liovcnt,
                              const iovec* remote_iov, unsigned long riovcnt, unsigned long flags)

cdef extern from "<sys/mman.h>" nogil:
    enum:
        MAP_FIXED
        MAP_PRIVATE
        MAP_ANONYMOUS
        MAP_NORESERVE
        PROT_NONE

cdef extern from "<sched.h>" nogil:
    int sched_yield()
