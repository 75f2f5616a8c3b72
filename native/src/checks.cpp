// The argument checks of checks.h, shared by the registry and the C API's files.
#include "checks.h"

ciq_status ciq_check_count(const char *what, const char *name, int64_t value) {
    if (value < 1) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %s must be >= 1, got %lld", what, name, (long long)value);
    return CIQ_OK;
}

ciq_status ciq_check_device(int device) {
    if (device == CIQ_DEVICE_CPU) return CIQ_OK;
#ifdef GGML_CIQ_WITH_CUDA
    int count = 0;
    CIQ_TRY(ciq_cuda_device_count(&count));
    if (device < 0 || device >= count) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "GPU device %d requested but %d CUDA device(s) found", device, count);
    }
    return CIQ_OK;
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "GPU device %d requested but libggml_ciq was built without CUDA", device);
#endif
}
