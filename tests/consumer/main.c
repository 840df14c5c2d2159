/* A program outside Ember's tree, built against an installed Ember (scripts/test_install.sh):
 * once through find_package(Ember CONFIG), once through pkg-config, each shared and static;
 * and against Ember built from source inside a parent project (scripts/test_embed.sh): with
 * add_subdirectory, shared and static, and with FetchContent. It checks the headers and the
 * library agree on the version and that a computation on the CPU gives the right answer;
 * exit 0 only then. */
#include <stdio.h>
#include <string.h>
#include <ember/ember.h>

int main(void) {
    if (strcmp(em_version(), EMBER_VERSION_STRING) != 0 || em_version_number() != EMBER_VERSION_NUMBER) {
        fprintf(stderr, "consumer: headers say %s, the library %s\n", EMBER_VERSION_STRING, em_version());
        return 1;
    }
    em_scope s = em_scope_begin();
    /* [[1, 2], [3, 4]] @ [[1, 1], [1, 1]] sums to 20 */
    const float a[] = {1, 2, 3, 4};
    em_tensor *x = em_from_data(a, EM_F32, EM_SHAPE(2, 2), EM_OPTS(0));
    em_tensor *y = em_ones(EM_SHAPE(2, 2), EM_OPTS(0));
    double sum = em_item(em_sum(em_matmul(x, y), EM_ALL_DIMS, false));
    int rc = 0;
    if (em_failed()) {
        fprintf(stderr, "consumer: %s\n", em_last_error());
        rc = 1;
    } else if (sum != 20.0) {
        fprintf(stderr, "consumer: expected 20, got %g\n", sum);
        rc = 1;
    } else {
        printf("consumer: Ember %s, sum %g, auto device %s\n", em_version(), sum,
               em_device_str(em_device_auto()).s);
    }
    em_scope_end(s);
    return rc;
}
