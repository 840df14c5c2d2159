/* Events for the OpenCL backend (backend.h's event slots): a marker queued after the work
 * queued so far, so the pinned cache can wait for one copy instead of a clFinish. */
#include <stdlib.h>
#include "../../util/errors.h"
#include "opencl_internal.h"

typedef struct ocl_event {
    cl_event ev;
    int index;
} ocl_event;

em_status em__ocl_event_record(int index, void **event) {
    *event = NULL;
    ocl_device *d = em__ocl_device(index);
    if (!d) return em_error(EM_ERR_DEVICE, "event: opencl:%d does not exist", index);
    ocl_event *e = malloc(sizeof *e);
    if (!e) return em_error(EM_ERR_OUT_OF_MEMORY, "event: no host memory");
    e->index = index;
    cl_int err = clEnqueueMarkerWithWaitList(d->queue, 0, NULL, &e->ev);
    if (err == CL_SUCCESS) {
        err = clFlush(d->queue); /* a marker nobody submits never completes */
        if (err != CL_SUCCESS) clReleaseEvent(e->ev);
    }
    if (err != CL_SUCCESS) {
        free(e);
        return em_error(EM_ERR_BACKEND, "opencl:%d: queueing an event: %s", index, em__ocl_err_name(err));
    }
    *event = e;
    return EM_OK;
}

em_status em__ocl_event_query(void *event, bool *done) {
    ocl_event *e = event;
    cl_int status = CL_QUEUED;
    cl_int err = clGetEventInfo(e->ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    if (err == CL_SUCCESS && status < 0) err = status; /* the queued work failed */
    *done = err == CL_SUCCESS && status == CL_COMPLETE;
    if (err != CL_SUCCESS)
        return em_error(EM_ERR_BACKEND, "opencl:%d: queued work failed: %s", e->index, em__ocl_err_name(err));
    return EM_OK;
}

em_status em__ocl_event_synchronize(void *event) {
    ocl_event *e = event;
    em__count_host_wait();
    cl_int err = clWaitForEvents(1, &e->ev);
    if (err != CL_SUCCESS)
        return em_error(EM_ERR_BACKEND, "opencl:%d: queued work failed: %s", e->index, em__ocl_err_name(err));
    return EM_OK;
}

void em__ocl_event_destroy(void *event) {
    ocl_event *e = event;
    if (!e) return;
    clReleaseEvent(e->ev);
    free(e);
}
