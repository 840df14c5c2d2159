/* The layer constructors' old names (before the em_nn_ rule) still build the same layers for
 * one release: each old name against its replacement, by repr and parameter count. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <string.h>
#include <ember/ember.h>
#include "test.h"

static void same(em_module *old, em_module *new_) {
    CHECK(old && new_);
    if (old && new_) {
        char a[512], b[512];
        em_module_format(old, a, sizeof a);
        em_module_format(new_, b, sizeof b);
        CHECK(!strcmp(a, b));
        CHECK(em_module_num_parameters(old) == em_module_num_parameters(new_));
    }
    em_module_free(old);
    em_module_free(new_);
}

static void test_old_names_build_the_same_layers(void) {
    em_scope s = em_scope_begin();
    same(em_linear(4, 3), em_nn_linear(4, 3));
    same(em_linear_ex(4, 3, false), em_nn_linear_ex(4, 3, false));
    same(em_relu_module(), em_nn_relu());
    same(em_gelu_module(), em_nn_gelu());
    same(em_sigmoid_module(), em_nn_sigmoid());
    same(em_tanh_module(), em_nn_tanh());
    same(em_dropout(0.25), em_nn_dropout(0.25));
    same(em_flatten_module(), em_nn_flatten());
    same(em_sequential(em_linear(2, 2), em_relu_module()), em_nn_sequential(em_nn_linear(2, 2), em_nn_relu()));
    same(em_conv2d_module(1, 2, EM_HW1(3)), em_nn_conv2d(1, 2, EM_HW1(3)));
    same(em_conv2d_module_ex(2, 4, EM_HW1(3), EM_HW1(2), EM_HW1(1), EM_HW1(1), 2, false),
         em_nn_conv2d_ex(2, 4, EM_HW1(3), EM_HW1(2), EM_HW1(1), EM_HW1(1), 2, false));
    same(em_max_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false),
         em_nn_max_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), EM_HW1(1), false));
    same(em_avg_pool2d_module(EM_HW1(2), EM_HW1(0), EM_HW1(0), false, true, 0),
         em_nn_avg_pool2d(EM_HW1(2), EM_HW1(0), EM_HW1(0), false, true, 0));
    same(em_adaptive_avg_pool2d_module(EM_HW1(1)), em_nn_adaptive_avg_pool2d(EM_HW1(1)));
    same(em_layer_norm_module(EM_SHAPE(8), 1e-5, true), em_nn_layer_norm(EM_SHAPE(8), 1e-5, true));
    same(em_batch_norm1d(8), em_nn_batch_norm1d(8));
    same(em_batch_norm2d(8), em_nn_batch_norm2d(8));
    same(em_batch_norm_ex(2, 8, 1e-3, 0.2, false, true), em_nn_batch_norm_ex(2, 8, 1e-3, 0.2, false, true));
    same(em_embedding_module(10, 4, EM_NO_PADDING_IDX), em_nn_embedding(10, 4, EM_NO_PADDING_IDX));
    same(em_multihead_attention(8, 2), em_nn_multihead_attention(8, 2));
    same(em_multihead_attention_ex(8, 2, 0.0, false, true), em_nn_multihead_attention_ex(8, 2, 0.0, false, true));
    CHECK(!em_failed());
    em_scope_end(s);
}

int main(void) {
    RUN(test_old_names_build_the_same_layers);
    return test_summary();
}
