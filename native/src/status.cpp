// The thread-local error message behind ciq_last_error.
#include "status.h"

#include <cstdarg>
#include <cstdio>

static thread_local char g_last_error[1024] = "";

ciq_status ciq_fail(ciq_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(g_last_error, sizeof(g_last_error), format, args);
    va_end(args);
    return status;
}

const char *ciq_last_error(void) { return g_last_error; }
