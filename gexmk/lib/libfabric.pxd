# Declarations only: libfabric (OFI) 1.17, <rdma/fabric.h> and friends.
#
# What an RDM RMA/atomic transport needs: discovery (fi_getinfo and the
# attribute structs), the object tree (fabric -> domain -> endpoint, CQ,
# counter, AV, MR), RMA and atomic data-path calls, and the error codes.
#
# Most fi_* "calls" are static inline functions in the headers that jump
# through the object's ops table, so declaring them as functions is exact.
# Flag words are 64-bit: they are declared `const uint64_t` so that Cython
# never narrows them to int; small bit sets (mr_mode) and enum values are
# `enum:`.  Macros that take arguments are declared as functions.
#
# iovec comes from Cython's posix.uio, so every gexmk module that cimports
# it sees one and the same type.

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from posix.uio cimport iovec


# ---------------------------------------------------------------------------
# rdma/fabric.h
# ---------------------------------------------------------------------------
cdef extern from "rdma/fabric.h" nogil:

    enum:
        FI_MAJOR_VERSION
        FI_MINOR_VERSION
        FI_REVISION_VERSION
        FI_PATH_MAX
        FI_NAME_MAX
        FI_VERSION_MAX

    # Macros with arguments, declared as functions.
    uint32_t FI_VERSION(uint32_t major, uint32_t minor)
    uint32_t FI_MAJOR(uint32_t version)
    uint32_t FI_MINOR(uint32_t version)

    uint32_t fi_version()

    ctypedef uint64_t fi_addr_t

    # -- capability and operation flags (fi_info.caps, op_flags, call flags) --
    const uint64_t FI_MSG
    const uint64_t FI_RMA
    const uint64_t FI_TAGGED
    const uint64_t FI_ATOMIC
    const uint64_t FI_ATOMICS
    const uint64_t FI_MULTICAST
    const uint64_t FI_COLLECTIVE
    const uint64_t FI_READ
    const uint64_t FI_WRITE
    const uint64_t FI_RECV
    const uint64_t FI_SEND
    const uint64_t FI_TRANSMIT
    const uint64_t FI_REMOTE_READ
    const uint64_t FI_REMOTE_WRITE
    const uint64_t FI_MULTI_RECV
    const uint64_t FI_REMOTE_CQ_DATA
    const uint64_t FI_MORE
    const uint64_t FI_PEEK
    const uint64_t FI_TRIGGER
    const uint64_t FI_FENCE
    const uint64_t FI_PRIORITY
    const uint64_t FI_COMPLETION
    const uint64_t FI_EVENT
    const uint64_t FI_INJECT
    const uint64_t FI_INJECT_COMPLETE
    const uint64_t FI_TRANSMIT_COMPLETE
    const uint64_t FI_DELIVERY_COMPLETE
    const uint64_t FI_AFFINITY
    const uint64_t FI_COMMIT_COMPLETE
    const uint64_t FI_MATCH_COMPLETE
    const uint64_t FI_PEER_TRANSFER
    const uint64_t FI_AV_USER_ID
    const uint64_t FI_PEER
    const uint64_t FI_XPU_TRIGGER
    const uint64_t FI_HMEM_HOST_ALLOC
    const uint64_t FI_HMEM_DEVICE_ONLY
    const uint64_t FI_HMEM
    const uint64_t FI_VARIABLE_MSG
    const uint64_t FI_RMA_PMEM
    const uint64_t FI_SOURCE_ERR
    const uint64_t FI_LOCAL_COMM
    const uint64_t FI_REMOTE_COMM
    const uint64_t FI_SHARED_AV
    const uint64_t FI_PROV_ATTR_ONLY
    const uint64_t FI_NUMERICHOST
    const uint64_t FI_RMA_EVENT
    const uint64_t FI_SOURCE
    const uint64_t FI_NAMED_RX_CTX
    const uint64_t FI_DIRECTED_RECV
    const uint64_t FI_CLAIM
    const uint64_t FI_DISCARD
    # fi_ep_bind flag
    const uint64_t FI_SELECTIVE_COMPLETION

    # -- mode bits (fi_info.mode) --
    const uint64_t FI_CONTEXT
    const uint64_t FI_MSG_PREFIX
    const uint64_t FI_ASYNC_IOV
    const uint64_t FI_RX_CQ_DATA
    const uint64_t FI_LOCAL_MR
    const uint64_t FI_NOTIFY_FLAGS_ONLY
    const uint64_t FI_RESTRICTED_COMP
    const uint64_t FI_CONTEXT2
    const uint64_t FI_BUFFERED_RECV

    # -- message ordering (tx_attr/rx_attr msg_order) --
    const uint64_t FI_ORDER_NONE
    const uint64_t FI_ORDER_RAR
    const uint64_t FI_ORDER_RAW
    const uint64_t FI_ORDER_RAS
    const uint64_t FI_ORDER_WAR
    const uint64_t FI_ORDER_WAW
    const uint64_t FI_ORDER_WAS
    const uint64_t FI_ORDER_SAR
    const uint64_t FI_ORDER_SAW
    const uint64_t FI_ORDER_SAS
    const uint64_t FI_ORDER_STRICT
    const uint64_t FI_ORDER_RMA_RAR
    const uint64_t FI_ORDER_RMA_RAW
    const uint64_t FI_ORDER_RMA_WAR
    const uint64_t FI_ORDER_RMA_WAW
    const uint64_t FI_ORDER_ATOMIC_RAR
    const uint64_t FI_ORDER_ATOMIC_RAW
    const uint64_t FI_ORDER_ATOMIC_WAR
    const uint64_t FI_ORDER_ATOMIC_WAW
    const uint64_t FI_ORDER_DATA

    const fi_addr_t FI_ADDR_UNSPEC
    const fi_addr_t FI_ADDR_NOTAVAIL
    const uint64_t FI_KEY_NOTAVAIL
    const size_t FI_SHARED_CONTEXT
    const uint32_t FI_PROV_SPECIFIC

    # -- address formats (fi_info.addr_format) --
    enum:
        FI_FORMAT_UNSPEC
        FI_SOCKADDR
        FI_SOCKADDR_IN
        FI_SOCKADDR_IN6
        FI_SOCKADDR_IB
        FI_ADDR_PSMX
        FI_ADDR_GNI
        FI_ADDR_BGQ
        FI_ADDR_MLX
        FI_ADDR_STR
        FI_ADDR_PSMX2
        FI_ADDR_IB_UD
        FI_ADDR_EFA
        FI_ADDR_PSMX3
        FI_ADDR_OPX
        FI_ADDR_CXI

    enum fi_av_type:
        FI_AV_UNSPEC
        FI_AV_MAP
        FI_AV_TABLE

    # mr_mode: the two legacy enum values plus the bit set of 1.5+.
    enum fi_mr_mode:
        FI_MR_UNSPEC
        FI_MR_BASIC
        FI_MR_SCALABLE
    enum:
        FI_MR_LOCAL
        FI_MR_RAW
        FI_MR_VIRT_ADDR
        FI_MR_ALLOCATED
        FI_MR_PROV_KEY
        FI_MR_MMU_NOTIFY
        FI_MR_RMA_EVENT
        FI_MR_ENDPOINT
        FI_MR_HMEM
        FI_MR_COLLECTIVE

    enum fi_progress:
        FI_PROGRESS_UNSPEC
        FI_PROGRESS_AUTO
        FI_PROGRESS_MANUAL

    enum fi_threading:
        FI_THREAD_UNSPEC
        FI_THREAD_SAFE
        FI_THREAD_FID
        FI_THREAD_DOMAIN
        FI_THREAD_COMPLETION
        FI_THREAD_ENDPOINT

    enum fi_resource_mgmt:
        FI_RM_UNSPEC
        FI_RM_DISABLED
        FI_RM_ENABLED

    enum fi_ep_type:
        FI_EP_UNSPEC
        FI_EP_MSG
        FI_EP_DGRAM
        FI_EP_RDM
        FI_EP_SOCK_STREAM
        FI_EP_SOCK_DGRAM

    enum:
        FI_PROTO_UNSPEC
        FI_PROTO_RXM
        FI_PROTO_RXD
        FI_PROTO_SHM
        FI_PROTO_EFA
        FI_PROTO_CXI
        FI_PROTO_SOCK_TCP
        FI_PROTO_XNET

    enum:
        FI_TC_UNSPEC
        FI_TC_BEST_EFFORT
        FI_TC_LOW_LATENCY
        FI_TC_DEDICATED_ACCESS
        FI_TC_BULK_DATA
        FI_TC_SCAVENGER
        FI_TC_NETWORK_CTRL

    # -- the object header every fid_* starts with --
    struct fi_ops:
        size_t size

    struct fid:
        size_t fclass
        void* context
        fi_ops* ops

    ctypedef fid* fid_t

    enum:
        FI_CLASS_UNSPEC
        FI_CLASS_FABRIC
        FI_CLASS_DOMAIN
        FI_CLASS_EP
        FI_CLASS_SEP
        FI_CLASS_AV
        FI_CLASS_MR
        FI_CLASS_EQ
        FI_CLASS_CQ
        FI_CLASS_CNTR
        FI_CLASS_WAIT
        FI_CLASS_NIC

    # -- attribute structs --
    struct fi_tx_attr:
        uint64_t caps
        uint64_t mode
        uint64_t op_flags
        uint64_t msg_order
        uint64_t comp_order
        size_t inject_size
        size_t size
        size_t iov_limit
        size_t rma_iov_limit
        uint32_t tclass

    struct fi_rx_attr:
        uint64_t caps
        uint64_t mode
        uint64_t op_flags
        uint64_t msg_order
        uint64_t comp_order
        size_t total_buffered_recv
        size_t size
        size_t iov_limit

    struct fi_ep_attr:
        fi_ep_type type
        uint32_t protocol
        uint32_t protocol_version
        size_t max_msg_size
        size_t msg_prefix_size
        size_t max_order_raw_size
        size_t max_order_war_size
        size_t max_order_waw_size
        uint64_t mem_tag_format
        size_t tx_ctx_cnt
        size_t rx_ctx_cnt
        size_t auth_key_size
        uint8_t* auth_key

    struct fid_domain
    struct fid_fabric

    struct fi_domain_attr:
        fid_domain* domain
        char* name
        fi_threading threading
        fi_progress control_progress
        fi_progress data_progress
        fi_resource_mgmt resource_mgmt
        fi_av_type av_type
        int mr_mode
        size_t mr_key_size
        size_t cq_data_size
        size_t cq_cnt
        size_t ep_cnt
        size_t tx_ctx_cnt
        size_t rx_ctx_cnt
        size_t max_ep_tx_ctx
        size_t max_ep_rx_ctx
        size_t max_ep_stx_ctx
        size_t max_ep_srx_ctx
        size_t cntr_cnt
        size_t mr_iov_limit
        uint64_t caps
        uint64_t mode
        uint8_t* auth_key
        size_t auth_key_size
        size_t max_err_data
        size_t mr_cnt
        uint32_t tclass

    struct fi_fabric_attr:
        fid_fabric* fabric
        char* name
        char* prov_name
        uint32_t prov_version
        uint32_t api_version

    # -- NIC description (fi_info.nic; may be NULL) --
    struct fi_device_attr:
        char* name
        char* device_id
        char* device_version
        char* vendor_id
        char* driver
        char* firmware

    enum fi_bus_type:
        FI_BUS_UNSPEC
        FI_BUS_UNKNOWN
        FI_BUS_PCI

    struct fi_pci_attr:
        uint16_t domain_id
        uint8_t bus_id
        uint8_t device_id
        uint8_t function_id

    # anonymous in C: reach it only as bus_attr.attr.pci, never name the type
    union _fi_bus_attr_u:
        fi_pci_attr pci

    struct fi_bus_attr:
        fi_bus_type bus_type
        _fi_bus_attr_u attr

    enum fi_link_state:
        FI_LINK_UNKNOWN
        FI_LINK_DOWN
        FI_LINK_UP

    struct fi_link_attr:
        char* address
        size_t mtu
        size_t speed
        fi_link_state state
        char* network_type

    struct fid_nic:
        fid fid
        fi_device_attr* device_attr
        fi_bus_attr* bus_attr
        fi_link_attr* link_attr
        void* prov_attr

    struct fi_info:
        fi_info* next
        uint64_t caps
        uint64_t mode
        uint32_t addr_format
        size_t src_addrlen
        size_t dest_addrlen
        void* src_addr
        void* dest_addr
        fid_t handle
        fi_tx_attr* tx_attr
        fi_rx_attr* rx_attr
        fi_ep_attr* ep_attr
        fi_domain_attr* domain_attr
        fi_fabric_attr* fabric_attr
        fid_nic* nic

    struct fid_fabric:
        fid fid
        uint32_t api_version

    # -- discovery --
    int fi_getinfo(uint32_t version, const char* node, const char* service, uint64_t flags, const fi_info* hints, fi_info** info)
    void fi_freeinfo(fi_info* info)
    fi_info* fi_dupinfo(const fi_info* info)
    # static inline in 1.17 (a macro in older headers): fi_dupinfo(NULL).
    fi_info* fi_allocinfo()

    # -- fabric and generic object calls --
    int fi_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context)
    int fi_close(fid* fid)
    int fi_control(fid* fid, int command, void* arg)
    int fi_open_ops(fid* fid, const char* name, uint64_t flags, void** ops, void* context)

    enum:
        FI_GETFIDFLAG
        FI_SETFIDFLAG
        FI_GETOPSFLAG
        FI_SETOPSFLAG
        FI_ALIAS
        FI_GETWAIT
        FI_ENABLE
        FI_BACKLOG
        FI_GET_RAW_MR
        FI_MAP_RAW_MR
        FI_UNMAP_KEY
        FI_REFRESH
        FI_DUP
        FI_GETWAITOBJ

    # Raw MR keys (FI_MR_RAW providers).  The C tags share their names with
    # the fi_mr_raw_attr()/fi_mr_map_raw() calls below, hence the _t aliases.
    struct fi_mr_raw_attr_t "fi_mr_raw_attr":
        uint64_t flags
        uint64_t* base_addr
        uint8_t* raw_key
        size_t* key_size

    struct fi_mr_map_raw_t "fi_mr_map_raw":
        uint64_t flags
        uint64_t base_addr
        uint8_t* raw_key
        size_t key_size
        uint64_t* key

    # Per-operation scratch space for providers that ask for FI_CONTEXT(2).
    struct fi_context:
        void* internal[4]

    struct fi_context2:
        void* internal[8]

    struct fi_ioc:
        void* addr
        size_t count

    # -- printing (not thread-safe: fi_tostr uses a static buffer) --
    enum fi_type:
        FI_TYPE_INFO
        FI_TYPE_EP_TYPE
        FI_TYPE_CAPS
        FI_TYPE_OP_FLAGS
        FI_TYPE_ADDR_FORMAT
        FI_TYPE_TX_ATTR
        FI_TYPE_RX_ATTR
        FI_TYPE_EP_ATTR
        FI_TYPE_DOMAIN_ATTR
        FI_TYPE_FABRIC_ATTR
        FI_TYPE_THREADING
        FI_TYPE_PROGRESS
        FI_TYPE_PROTOCOL
        FI_TYPE_MSG_ORDER
        FI_TYPE_MODE
        FI_TYPE_AV_TYPE
        FI_TYPE_ATOMIC_TYPE
        FI_TYPE_ATOMIC_OP
        FI_TYPE_VERSION
        FI_TYPE_EQ_EVENT
        FI_TYPE_CQ_EVENT_FLAGS
        FI_TYPE_MR_MODE
        FI_TYPE_OP_TYPE
        FI_TYPE_FID
        FI_TYPE_COLLECTIVE_OP
        FI_TYPE_HMEM_IFACE
        FI_TYPE_CQ_FORMAT

    char* fi_tostr(const void* data, fi_type datatype)
    char* fi_tostr_r(char* buf, size_t len, const void* data, fi_type datatype)


# ---------------------------------------------------------------------------
# rdma/fi_errno.h -- calls return 0/positive on success, -FI_E* on failure.
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_errno.h" nogil:
    enum:
        FI_SUCCESS
        FI_EPERM
        FI_ENOENT
        FI_EINTR
        FI_EIO
        FI_E2BIG
        FI_EBADF
        FI_EAGAIN
        FI_ENOMEM
        FI_EACCES
        FI_EFAULT
        FI_EBUSY
        FI_ENODEV
        FI_EINVAL
        FI_EMFILE
        FI_ENOSPC
        FI_ENOSYS
        FI_EWOULDBLOCK
        FI_ENOMSG
        FI_ENODATA
        FI_EOVERFLOW
        FI_EMSGSIZE
        FI_ENOPROTOOPT
        FI_EOPNOTSUPP
        FI_EADDRINUSE
        FI_EADDRNOTAVAIL
        FI_ENETDOWN
        FI_ENETUNREACH
        FI_ECONNABORTED
        FI_ECONNRESET
        FI_ENOBUFS
        FI_EISCONN
        FI_ENOTCONN
        FI_ESHUTDOWN
        FI_ETIMEDOUT
        FI_ECONNREFUSED
        FI_EHOSTDOWN
        FI_EHOSTUNREACH
        FI_EALREADY
        FI_EINPROGRESS
        FI_EREMOTEIO
        FI_ECANCELED
        FI_EKEYREJECTED
        FI_ERRNO_OFFSET
        FI_EOTHER
        FI_ETOOSMALL
        FI_EOPBADSTATE
        FI_EAVAIL
        FI_EBADFLAGS
        FI_ENOEQ
        FI_EDOMAIN
        FI_ENOCQ
        FI_ECRC
        FI_ETRUNC
        FI_ENOKEY
        FI_ENOAV
        FI_EOVERRUN
        FI_ENORX
        FI_ERRNO_MAX

    const char* fi_strerror(int errnum)


# ---------------------------------------------------------------------------
# rdma/fi_eq.h -- event queues, completion queues, counters, wait sets
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_eq.h" nogil:

    enum fi_wait_obj:
        FI_WAIT_NONE
        FI_WAIT_UNSPEC
        FI_WAIT_SET
        FI_WAIT_FD
        FI_WAIT_MUTEX_COND
        FI_WAIT_YIELD
        FI_WAIT_POLLFD

    struct fid_wait:
        fid fid

    struct fi_wait_attr:
        fi_wait_obj wait_obj
        uint64_t flags

    # -- event queue (connection management, async MR/AV completions) --
    struct fi_eq_attr:
        size_t size
        uint64_t flags
        fi_wait_obj wait_obj
        int signaling_vector
        fid_wait* wait_set

    enum:
        FI_NOTIFY
        FI_CONNREQ
        FI_CONNECTED
        FI_SHUTDOWN
        FI_MR_COMPLETE
        FI_AV_COMPLETE
        FI_JOIN_COMPLETE

    struct fi_eq_entry:
        fid_t fid
        void* context
        uint64_t data

    struct fi_eq_err_entry:
        fid_t fid
        void* context
        uint64_t data
        int err
        int prov_errno
        void* err_data
        size_t err_data_size

    struct fid_eq:
        fid fid

    # -- completion queue --
    enum fi_cq_format:
        FI_CQ_FORMAT_UNSPEC
        FI_CQ_FORMAT_CONTEXT
        FI_CQ_FORMAT_MSG
        FI_CQ_FORMAT_DATA
        FI_CQ_FORMAT_TAGGED

    struct fi_cq_entry:
        void* op_context

    struct fi_cq_msg_entry:
        void* op_context
        uint64_t flags
        size_t len

    struct fi_cq_data_entry:
        void* op_context
        uint64_t flags
        size_t len
        void* buf
        uint64_t data

    struct fi_cq_tagged_entry:
        void* op_context
        uint64_t flags
        size_t len
        void* buf
        uint64_t data
        uint64_t tag

    struct fi_cq_err_entry:
        void* op_context
        uint64_t flags
        size_t len
        void* buf
        uint64_t data
        uint64_t tag
        size_t olen
        int err
        int prov_errno
        void* err_data
        size_t err_data_size

    enum fi_cq_wait_cond:
        FI_CQ_COND_NONE
        FI_CQ_COND_THRESHOLD

    struct fi_cq_attr:
        size_t size
        uint64_t flags
        fi_cq_format format
        fi_wait_obj wait_obj
        int signaling_vector
        fi_cq_wait_cond wait_cond
        fid_wait* wait_set

    struct fid_cq:
        fid fid

    # -- counter --
    enum fi_cntr_events:
        FI_CNTR_EVENTS_COMP

    struct fi_cntr_attr:
        fi_cntr_events events
        fi_wait_obj wait_obj
        fid_wait* wait_set
        uint64_t flags

    struct fid_cntr:
        fid fid

    int fi_wait_open(fid_fabric* fabric, fi_wait_attr* attr, fid_wait** waitset)
    int fi_wait(fid_wait* waitset, int timeout)
    int fi_trywait(fid_fabric* fabric, fid** fids, int count)

    int fi_eq_open(fid_fabric* fabric, fi_eq_attr* attr, fid_eq** eq, void* context)
    ssize_t fi_eq_read(fid_eq* eq, uint32_t* event, void* buf, size_t len, uint64_t flags)
    ssize_t fi_eq_readerr(fid_eq* eq, fi_eq_err_entry* buf, uint64_t flags)
    ssize_t fi_eq_sread(fid_eq* eq, uint32_t* event, void* buf, size_t len, int timeout, uint64_t flags)
    const char* fi_eq_strerror(fid_eq* eq, int prov_errno, const void* err_data, char* buf, size_t len)

    ssize_t fi_cq_read(fid_cq* cq, void* buf, size_t count)
    ssize_t fi_cq_readfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src_addr)
    ssize_t fi_cq_readerr(fid_cq* cq, fi_cq_err_entry* buf, uint64_t flags)
    ssize_t fi_cq_sread(fid_cq* cq, void* buf, size_t count, const void* cond, int timeout)
    ssize_t fi_cq_sreadfrom(fid_cq* cq, void* buf, size_t count, fi_addr_t* src_addr, const void* cond, int timeout)
    int fi_cq_signal(fid_cq* cq)
    const char* fi_cq_strerror(fid_cq* cq, int prov_errno, const void* err_data, char* buf, size_t len)

    uint64_t fi_cntr_read(fid_cntr* cntr)
    uint64_t fi_cntr_readerr(fid_cntr* cntr)
    int fi_cntr_add(fid_cntr* cntr, uint64_t value)
    int fi_cntr_adderr(fid_cntr* cntr, uint64_t value)
    int fi_cntr_set(fid_cntr* cntr, uint64_t value)
    int fi_cntr_seterr(fid_cntr* cntr, uint64_t value)
    int fi_cntr_wait(fid_cntr* cntr, uint64_t threshold, int timeout)


# ---------------------------------------------------------------------------
# rdma/fi_domain.h -- domain, address vector, memory registration, atomics types
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_domain.h" nogil:

    const uint64_t FI_SYMMETRIC
    const uint64_t FI_SYNC_ERR
    const uint64_t FI_UNIVERSE
    const uint64_t FI_REG_MR

    struct fid_domain:
        fid fid

    # -- address vector --
    struct fi_av_attr:
        fi_av_type type
        int rx_ctx_bits
        size_t count
        size_t ep_per_node
        const char* name
        void* map_addr
        uint64_t flags

    struct fid_av:
        fid fid

    # -- memory registration --
    struct fid_mr:
        fid fid
        void* mem_desc
        uint64_t key

    enum fi_hmem_iface:
        FI_HMEM_SYSTEM
        FI_HMEM_CUDA
        FI_HMEM_ROCR
        FI_HMEM_ZE
        FI_HMEM_NEURON
        FI_HMEM_SYNAPSEAI

    # anonymous in C: reach it only as attr.device.cuda, never name the type
    union _fi_mr_attr_device:
        uint64_t reserved
        int cuda
        int ze
        int neuron
        int synapseai

    struct fi_mr_attr:
        const iovec* mr_iov
        size_t iov_count
        uint64_t access
        uint64_t offset
        uint64_t requested_key
        void* context
        size_t auth_key_size
        uint8_t* auth_key
        fi_hmem_iface iface
        _fi_mr_attr_device device

    # -- atomic datatypes and operations --
    enum fi_datatype:
        FI_INT8
        FI_UINT8
        FI_INT16
        FI_UINT16
        FI_INT32
        FI_UINT32
        FI_INT64
        FI_UINT64
        FI_FLOAT
        FI_DOUBLE
        FI_FLOAT_COMPLEX
        FI_DOUBLE_COMPLEX
        FI_LONG_DOUBLE
        FI_LONG_DOUBLE_COMPLEX
        FI_DATATYPE_LAST

    enum fi_op:
        FI_MIN
        FI_MAX
        FI_SUM
        FI_PROD
        FI_LOR
        FI_LAND
        FI_BOR
        FI_BAND
        FI_LXOR
        FI_BXOR
        FI_ATOMIC_READ
        FI_ATOMIC_WRITE
        FI_CSWAP
        FI_CSWAP_NE
        FI_CSWAP_LE
        FI_CSWAP_LT
        FI_CSWAP_GE
        FI_CSWAP_GT
        FI_MSWAP
        FI_ATOMIC_OP_LAST

    int fi_domain(fid_fabric* fabric, fi_info* info, fid_domain** domain, void* context)
    int fi_domain_bind(fid_domain* domain, fid* fid, uint64_t flags)
    int fi_cq_open(fid_domain* domain, fi_cq_attr* attr, fid_cq** cq, void* context)
    int fi_cntr_open(fid_domain* domain, fi_cntr_attr* attr, fid_cntr** cntr, void* context)

    int fi_mr_reg(fid_domain* domain, const void* buf, size_t len, uint64_t acs, uint64_t offset, uint64_t requested_key, uint64_t flags, fid_mr** mr, void* context)
    int fi_mr_regv(fid_domain* domain, const iovec* iov, size_t count, uint64_t acs, uint64_t offset, uint64_t requested_key, uint64_t flags, fid_mr** mr, void* context)
    int fi_mr_regattr(fid_domain* domain, const fi_mr_attr* attr, uint64_t flags, fid_mr** mr)
    void* fi_mr_desc(fid_mr* mr)
    uint64_t fi_mr_key(fid_mr* mr)
    int fi_mr_raw_attr(fid_mr* mr, uint64_t* base_addr, uint8_t* raw_key, size_t* key_size, uint64_t flags)
    int fi_mr_map_raw(fid_domain* domain, uint64_t base_addr, uint8_t* raw_key, size_t key_size, uint64_t* key, uint64_t flags)
    int fi_mr_unmap_key(fid_domain* domain, uint64_t key)
    int fi_mr_bind(fid_mr* mr, fid* bfid, uint64_t flags)
    int fi_mr_refresh(fid_mr* mr, const iovec* iov, size_t count, uint64_t flags)
    int fi_mr_enable(fid_mr* mr)

    int fi_av_open(fid_domain* domain, fi_av_attr* attr, fid_av** av, void* context)
    int fi_av_bind(fid_av* av, fid* fid, uint64_t flags)
    int fi_av_insert(fid_av* av, const void* addr, size_t count, fi_addr_t* fi_addr, uint64_t flags, void* context)
    int fi_av_insertsvc(fid_av* av, const char* node, const char* service, fi_addr_t* fi_addr, uint64_t flags, void* context)
    int fi_av_remove(fid_av* av, fi_addr_t* fi_addr, size_t count, uint64_t flags)
    int fi_av_lookup(fid_av* av, fi_addr_t fi_addr, void* addr, size_t* addrlen)
    const char* fi_av_straddr(fid_av* av, const void* addr, char* buf, size_t* len)


# ---------------------------------------------------------------------------
# rdma/fi_endpoint.h -- endpoints
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_endpoint.h" nogil:

    struct fid_ep:
        fid fid

    struct fi_msg:
        const iovec* msg_iov
        void** desc
        size_t iov_count
        fi_addr_t addr
        void* context
        uint64_t data

    enum:
        FI_OPT_ENDPOINT

    enum:
        FI_OPT_MIN_MULTI_RECV
        FI_OPT_CM_DATA_SIZE
        FI_OPT_BUFFERED_MIN
        FI_OPT_BUFFERED_LIMIT
        FI_OPT_SEND_BUF_SIZE
        FI_OPT_RECV_BUF_SIZE
        FI_OPT_TX_SIZE
        FI_OPT_RX_SIZE
        FI_OPT_FI_HMEM_P2P

    enum:
        FI_HMEM_P2P_ENABLED
        FI_HMEM_P2P_REQUIRED
        FI_HMEM_P2P_PREFERRED
        FI_HMEM_P2P_DISABLED

    int fi_endpoint(fid_domain* domain, fi_info* info, fid_ep** ep, void* context)
    int fi_ep_bind(fid_ep* ep, fid* bfid, uint64_t flags)
    int fi_enable(fid_ep* ep)
    ssize_t fi_cancel(fid_t fid, void* context)
    int fi_setopt(fid_t fid, int level, int optname, const void* optval, size_t optlen)
    int fi_getopt(fid_t fid, int level, int optname, void* optval, size_t* optlen)

    # two-sided messages: used for bootstrap-free handshakes and AM-style control
    ssize_t fi_recv(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src_addr, void* context)
    ssize_t fi_send(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest_addr, void* context)
    ssize_t fi_inject(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest_addr)
    ssize_t fi_sendmsg(fid_ep* ep, const fi_msg* msg, uint64_t flags)
    ssize_t fi_recvmsg(fid_ep* ep, const fi_msg* msg, uint64_t flags)


# ---------------------------------------------------------------------------
# rdma/fi_cm.h -- endpoint names (what peers insert into their AV)
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_cm.h" nogil:
    int fi_getname(fid_t fid, void* addr, size_t* addrlen)
    int fi_setname(fid_t fid, void* addr, size_t addrlen)


# ---------------------------------------------------------------------------
# rdma/fi_rma.h -- one-sided reads and writes
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_rma.h" nogil:

    struct fi_rma_iov:
        uint64_t addr
        size_t len
        uint64_t key

    struct fi_rma_ioc:
        uint64_t addr
        size_t count
        uint64_t key

    struct fi_msg_rma:
        const iovec* msg_iov
        void** desc
        size_t iov_count
        fi_addr_t addr
        const fi_rma_iov* rma_iov
        size_t rma_iov_count
        void* context
        uint64_t data

    ssize_t fi_read(fid_ep* ep, void* buf, size_t len, void* desc, fi_addr_t src_addr, uint64_t addr, uint64_t key, void* context)
    ssize_t fi_readv(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t src_addr, uint64_t addr, uint64_t key, void* context)
    ssize_t fi_readmsg(fid_ep* ep, const fi_msg_rma* msg, uint64_t flags)
    ssize_t fi_write(fid_ep* ep, const void* buf, size_t len, void* desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void* context)
    ssize_t fi_writev(fid_ep* ep, const iovec* iov, void** desc, size_t count, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void* context)
    ssize_t fi_writemsg(fid_ep* ep, const fi_msg_rma* msg, uint64_t flags)
    ssize_t fi_inject_write(fid_ep* ep, const void* buf, size_t len, fi_addr_t dest_addr, uint64_t addr, uint64_t key)
    ssize_t fi_writedata(fid_ep* ep, const void* buf, size_t len, void* desc, uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key, void* context)
    ssize_t fi_inject_writedata(fid_ep* ep, const void* buf, size_t len, uint64_t data, fi_addr_t dest_addr, uint64_t addr, uint64_t key)


# ---------------------------------------------------------------------------
# rdma/fi_atomic.h -- remote atomics
# ---------------------------------------------------------------------------
cdef extern from "rdma/fi_atomic.h" nogil:

    const uint64_t FI_FETCH_ATOMIC
    const uint64_t FI_COMPARE_ATOMIC

    struct fi_atomic_attr:
        size_t count
        size_t size

    struct fi_msg_atomic:
        const fi_ioc* msg_iov
        void** desc
        size_t iov_count
        fi_addr_t addr
        const fi_rma_ioc* rma_iov
        size_t rma_iov_count
        fi_datatype datatype
        fi_op op
        void* context
        uint64_t data

    ssize_t fi_atomic(fid_ep* ep, const void* buf, size_t count, void* desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, fi_datatype datatype, fi_op op, void* context)
    ssize_t fi_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, uint64_t flags)
    ssize_t fi_inject_atomic(fid_ep* ep, const void* buf, size_t count, fi_addr_t dest_addr, uint64_t addr, uint64_t key, fi_datatype datatype, fi_op op)
    ssize_t fi_fetch_atomic(fid_ep* ep, const void* buf, size_t count, void* desc, void* result, void* result_desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, fi_datatype datatype, fi_op op, void* context)
    ssize_t fi_fetch_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, fi_ioc* resultv, void** result_desc, size_t result_count, uint64_t flags)
    ssize_t fi_compare_atomic(fid_ep* ep, const void* buf, size_t count, void* desc, const void* compare, void* compare_desc, void* result, void* result_desc, fi_addr_t dest_addr, uint64_t addr, uint64_t key, fi_datatype datatype, fi_op op, void* context)
    ssize_t fi_compare_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev, void** compare_desc, size_t compare_count, fi_ioc* resultv, void** result_desc, size_t result_count, uint64_t flags)
    int fi_atomicvalid(fid_ep* ep, fi_datatype datatype, fi_op op, size_t* count)
    int fi_fetch_atomicvalid(fid_ep* ep, fi_datatype datatype, fi_op op, size_t* count)
    int fi_compare_atomicvalid(fid_ep* ep, fi_datatype datatype, fi_op op, size_t* count)
    int fi_query_atomic(fid_domain* domain, fi_datatype datatype, fi_op op, fi_atomic_attr* attr, uint64_t flags)
