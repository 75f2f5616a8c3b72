// The kernel variant registry: one table of every GEMM variant (name, semantics, weight types, architecture predicate,
// token range, launcher) and, beside it, the tuning data per architecture (AUTO order, offload thresholds).
// registry.cpp holds the data; ciq_gemm_plan (registry.cpp) is the one place a variant is resolved.
#pragma once
#include "checks.h"

// What an architecture predicate sees of a device.
struct ciq_device_facts {
    bool host;       // CIQ_DEVICE_CPU
    bool hip;        // an AMD GPU of the HIP build (major is then the gfx generation: 11 RDNA3, 12 RDNA4)
    int major;       // compute capability
    int minor;
    bool built_90a;  // the build carries sm_90a machine code
};
ciq_status ciq_device_facts_get(int device, ciq_device_facts *facts);

// Runs a resolved variant on quantized activations; the device is selected and the arguments checked.
typedef ciq_status (*ciq_gemm_launcher)(int device, ciq_variant variant, ciq_semantics semantics, ciq_type type,
                                        const void *weight, int64_t rows, int64_t k, const void *x_quantized,
                                        int64_t tokens, void *out, ciq_out_type out_type);

struct ciq_variant_row {
    ciq_variant variant;
    ciq_variant_info info;                            // what ciq_variant_describe returns
    bool (*runs_on)(const ciq_device_facts &device);  // the architecture predicate
    ciq_gemm_launcher launch;
};

// The row of a variant (AUTO included); nullptr for a value outside the enum.
const ciq_variant_row *ciq_registry_row(ciq_variant variant);
// Whether a row multiplies this weight type.
bool ciq_registry_covers(const ciq_variant_row &row, ciq_type type);
// The semantics bits a row runs this weight type in on the host (host = true) or a GPU: its row's, less what
// registry.cpp's k_type_semantics takes away; 0 where it does not multiply the type.
uint32_t ciq_registry_semantics(const ciq_variant_row &row, ciq_type type, bool host);
// Values per block and bytes per block of a weight type (0 for a type no variant reads).
int ciq_type_block_values(ciq_type type);
int ciq_type_block_bytes(ciq_type type);
const char *ciq_type_name(ciq_type type);
const char *ciq_semantics_name(ciq_semantics semantics);
