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
    MPI_Request *hreq;      /* npeer receives, then npeer sends */
#endif
    int64_t *hin;           /* npeer headers received */
    bool *hseen;
    int *hidx;              /* MPI_Testsome's answer */
    struct em_dist_work *next_dead; /* in the group's graveyard */
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
#endif
};

double em__dist_now(void);
/* Make progress on w without blocking (block false) or until it finishes. */
em_status em__dist_progress(em_dist_work *w, bool block);
/* Record that g cannot be used any more (first message kept). */
void em__dist_break(em_dist_group *g, const char *msg);
/* The group a call names (NULL: the world), or NULL and an error naming op. */
em_dist_group *em__dist_resolve(em_dist_group *g, const char *op);
/* Frees the buffers of works that failed (at finalize). */
void em__dist_bury(em_dist_group *g);

#endif
