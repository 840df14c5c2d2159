/* libFuzzer target: numeric CSV. The first byte picks the options. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t sel = data[0];
    static const int labels[] = {0, -1, 2, EM_CSV_NO_LABEL};
    em_csv_opts o = {.header = sel & 1, .label_column = labels[(sel >> 1) & 3],
                     .delimiter = (sel & 8) ? ';' : 0};
    em__array x, y;
    em_status s = em__csv_parse("fuzz.csv", data + 1, size - 1, &o, &x, (sel & 16) ? NULL : &y);
    if (s == EM_OK) {
        fuzz_check_array(&x);
        if (!(sel & 16) && y.data) {
            fuzz_check_array(&y);
            if (y.shape[0] != x.shape[0]) __builtin_trap();
        }
    }
    em__array_free(&x);
    if (!(sel & 16)) em__array_free(&y);
    fuzz_check_status(s);
    return 0;
}
