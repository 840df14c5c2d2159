/* The dist layer's private parts (src/dist/): the group and a collective's work record.
 * dist is an upper layer: it uses the public API and src/core/internal_api.h only. */
#ifndef EM_DIST_INTERNAL_H
#define EM_DIST_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/dist.h>
#ifdef EMBER_HAVE_MPI
#include <mpi.h>
#endif

/* What each rank sends the others alongside a collective's data: enough to tell two
 * different calls apart. */
enum { HDR_SEQ, HDR_KIND, HDR_DTYPE, HDR_COUNT, HDR_ROOT, HDR_OP, HDR_WORDS };
typedef enum coll_kind { C_ALL_REDUCE = 1, C_BROADCAST, C_ALL_GATHER, C_REDUCE_SCATTER, C_BARRIER } coll_kind;

/* ---- NCCL, loaded with dlopen (nccl.c): the subset Ember calls, typed as nccl.h declares
 * it (ncclComm_t is a pointer, ncclDataType_t and ncclRedOp_t are int-sized enums) ---- */
typedef struct em_nccl_unique_id { char internal[128]; } em_nccl_unique_id;
enum { NCCL_INT8 = 0, NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7,
       NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9 };
enum { NCCL_SUM = 0, NCCL_MAX = 2, NCCL_MIN = 3, NCCL_AVG = 4 };
typedef struct em_nccl_api {
    int (*ncclGetVersion)(int *version);
    int (*ncclGetUniqueId)(em_nccl_unique_id *id);
    int (*ncclCommInitRank)(void **comm, int nranks, em_nccl_unique_id id, int rank);
    int (*ncclCommDestroy)(void *comm);
    int (*ncclCommAbort)(void *comm);
    int (*ncclCommGetAsyncError)(void *comm, int *async_error);
    const char *(*ncclGetErrorString)(int result);
    int (*ncclAllReduce)(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream);
    int (*ncclBroadcast)(const void *send, void *recv, size_t count, int dtype, int root, void *comm, void *stream);
    int (*ncclAllGather)(const void *send, void *recv, size_t sendcount, int dtype, void *comm, void *stream);
    int (*ncclReduceScatter)(const void *send, void *recv, size_t recvcount, int dtype, int op, void *comm, void *stream);
    int (*ncclGroupStart)(void);
    int (*ncclGroupEnd)(void);
} em_nccl_api;
/* Tests: use this table instead of libnccl.so.2 (NULL: load the real one again). */
void em__dist_nccl_use_fake(const em_nccl_api *api);
/* The table, or NULL with *reason. */
const em_nccl_api *em__dist_nccl(int *version, const char **reason);

/* all_reduce's algorithms (allreduce.c): MPI's non-blocking collective, or Ember's own over
 * point-to-point messages */
enum { AR_MPI, AR_DIRECT, AR_RING };
enum { AR_WINDOW = 4, AR_MAX_REQ = 128 };

struct em_dist_work {
    em_dist_group *g;
    coll_kind kind;
    em_reduce_op op;
    int root;
    em_dtype dtype;         /* the callers' dtype (in the header) */
    int64_t count;          /* elements per rank as in the header */
    int64_t hdr[HDR_WORDS]; /* this rank's header (sent to every peer) */
    em_tensor *dst, *src;   /* the user's tensors (retained): results land in dst */
    em_tensor *rbuf, *sbuf; /* host buffers MPI reads and writes (retained); rbuf may be dst */
    bool copy_back;         /* rbuf is a staging copy of dst */
    bool finished;          /* success or failure decided */
    bool data_done;
    bool mpi_pending;       /* MPI still owns the buffers (a failed work) */
    em_status status;
    char *msg;              /* the failure's message, raised again by every wait */
    double start, deadline;
    int npeer;              /* size - 1 */
    int peers_left;         /* headers not yet received */
#ifdef EMBER_HAVE_MPI
    MPI_Request req;
    MPI_Request *hreq;      /* npeer receives, then npeer sends (this and the next three in w's own block) */
#endif
    int64_t *hin;           /* npeer headers received */
    bool *hseen;
    int *hidx;              /* MPI_Testsome's answer */
    bool nccl;              /* the data goes through NCCL on the tensors' CUDA stream */
    bool avg_done;          /* NCCL averaged already (ncclAvg) */
    void *mark;             /* NCCL: an event after the collective on the stream */
    struct em_dist_work *next_dead; /* in the group's graveyard */
    struct em_dist_work *next_active; /* in the group's list of point-to-point works in flight */
    /* all_reduce over point-to-point (allreduce.c) */
    em_dtype wire;          /* the dtype in rbuf */
    int ar_algo;            /* AR_MPI, AR_DIRECT or AR_RING */
    int ar_step, ar_nsteps; /* the step in progress, of how many */
    uint64_t ar_moves;      /* messages and steps completed (the wait loop sleeps when it stalls) */
    int64_t ar_pieces;      /* direct: messages per peer (each small enough to go eagerly) */
    int ar_tag;             /* this collective's messages (from the sequence number) */
    bool ar_posted;         /* the step's messages are posted */
    bool ar_step_done, ar_count_ok;
    int ar_in_chunk, ar_out_chunk; /* the ring chunks the step receives and sends */
    int ar_nreq, ar_nrecv;  /* the step's requests: receives first */
    int64_t ar_rseg, ar_sseg;   /* a ring reduce step's segments received and sent */
    int64_t ar_rpost, ar_rdone; /* receives posted, reduced */
    int64_t ar_spost, ar_sdone; /* sends posted, completed */
    void *ar_tmp;           /* what the receives land in before they are reduced */
    size_t ar_tmp_size;
#ifdef EMBER_HAVE_MPI
    MPI_Request ar_req[AR_MAX_REQ];
#endif
    int ar_peer[AR_MAX_REQ];/* each request's peer */
};

struct em_dist_group {
    int rank, size, local_rank;
    double timeout_s;
    const char *backend;    /* "mpi" or "nccl" */
    uint64_t seq;           /* collectives started */
    bool broken;
    char *broken_msg;
    em_dist_work *graveyard;/* failed works whose buffers MPI may still own */
#ifdef EMBER_HAVE_MPI
    MPI_Comm comm, hcomm;   /* data and headers */
    int tag_ub;             /* MPI's largest tag on comm */
#endif
    em_dist_work *active;   /* point-to-point all_reduces in flight (every wait moves them all) */
    int ar_force;           /* EMBER_DIST_ALLREDUCE: an AR_ algorithm for every all_reduce, or -1 */
    void *ar_spare;         /* a finished all_reduce's receive buffer, for the next one */
    size_t ar_spare_size;
    bool use_nccl;          /* backend "nccl": CUDA tensors through NCCL */
    void *nccl_comm;        /* made at the first CUDA collective */
    int nccl_device;        /* the CUDA device it was made for */
};

/* NCCL's part of a collective (nccl.c): start w's data on NCCL (w's tensors are CUDA,
 * contiguous); whether it has finished (1), not yet (0), failed (-1, recorded). */
em_status em__dist_nccl_start(em_dist_work *w);
/* The group's communicator for cuda:device (made at the first call: a collective itself). */
em_status em__dist_nccl_ensure(em_dist_group *g, int device);
int em__dist_nccl_done(em_dist_work *w);
/* A timed-out collective: abort the communicator so that the stream is released. */
void em__dist_nccl_abort(em_dist_group *g);
void em__dist_nccl_destroy(em_dist_group *g);

double em__dist_now(void);
/* Make progress on w without blocking (block false) or until it finishes. */
em_status em__dist_progress(em_dist_work *w, bool block);
/* Record that g cannot be used any more (first message kept). */
void em__dist_break(em_dist_group *g, const char *msg);
/* The group a call names (NULL: the world), or NULL and an error naming op. */
em_dist_group *em__dist_resolve(em_dist_group *g, const char *op);
#ifdef EMBER_HAVE_MPI
/* all_reduce over point-to-point (allreduce.c). The algorithm for count elements of wire. */
int em__ar_choose(const em_dist_group *g, int64_t count, em_dtype wire);
/* Allocate w's buffers (w->ar_algo, count, wire, rbuf set): an MPI error code. */
int em__ar_start(em_dist_work *w);
/* Move w along without blocking: 1 done, 0 not yet, -1 an MPI error (*mpi_rc, the call in
 * *call). Nothing is reduced until headers_ok (every peer's header arrived and matched). */
int em__ar_progress(em_dist_work *w, bool headers_ok, int *mpi_rc, const char **call);
/* Hands w's receive buffer back to the group (w finished: MPI no longer writes it). */
void em__ar_release(em_dist_work *w);
/* The peers w waits on, as "1, 2" in buf; how many. */
int em__ar_waiting_for(const em_dist_work *w, char *buf, size_t size);
MPI_Datatype em__dist_mpi_type(em_dtype dt);
#endif
/* Releases w's tensors and frees w with its arrays, now: MPI must no longer own its buffers. */
void em__dist_work_free_now(em_dist_work *w);
/* Frees the buffers of works that failed (at finalize). */
void em__dist_bury(em_dist_group *g);

#endif
