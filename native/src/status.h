// Status and error plumbing shared by every file of the library (the API, cpu/, cuda/) and the CUDA-on-CPU
// emulation: a failing call records a thread-local message (ciq_last_error) and returns its status.
#pragma once
#include "ggml_ciq.h"

// Records the thread-local error message and returns status.
ciq_status ciq_fail(ciq_status status, const char *format, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define CIQ_TRY(expr)                          \
    do {                                       \
        ciq_status status_ = (expr);           \
        if (status_ != CIQ_OK) return status_; \
    } while (0)
