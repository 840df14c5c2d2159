/* libFuzzer target: safetensors files (header JSON and offset validation). */
#include <string.h>
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em__st_file f;
    em_status s = em__safetensors_parse("fuzz.safetensors", data, size, &f);
    if (s == EM_OK) {
        for (int i = 0; i < f.count; i++) {
            const em__st_tensor *t = &f.tensors[i];
            if (t->begin > t->end || f.data_start + t->end > size) __builtin_trap();
            fuzz_touch(data + f.data_start + t->begin, t->end - t->begin);
            fuzz_touch(t->name, strlen(t->name));
            if (i && t->begin < f.tensors[i - 1].begin) __builtin_trap();
        }
        for (int i = 0; i < f.meta_count; i++)
            fuzz_touch(f.meta_values[i], strlen(f.meta_values[i]));
    }
    em__st_file_free(&f);
    fuzz_check_status(s);
    return 0;
}
