/* The layer constructors' names from before the em_nn_ rule (include/ember/nn.h), kept for
 * one release: each calls its replacement. */
#include <ember/nn.h>

em_module *em_linear(int64_t in_features, int64_t out_features) { return em_nn_linear(in_features, out_features); }
em_module *em_linear_ex(int64_t in_features, int64_t out_features, bool bias) {
    return em_nn_linear_ex(in_features, out_features, bias);
}
em_module *em_relu_module(void) { return em_nn_relu(); }
em_module *em_gelu_module(void) { return em_nn_gelu(); }
em_module *em_sigmoid_module(void) { return em_nn_sigmoid(); }
em_module *em_tanh_module(void) { return em_nn_tanh(); }
em_module *em_dropout(double p) { return em_nn_dropout(p); }
em_module *em_flatten_module(void) { return em_nn_flatten(); }
em_module *em_sequential_n(int n, em_module *const *modules) { return em_nn_sequential_n(n, modules); }
em_module *em_conv2d_module(int64_t in_channels, int64_t out_channels, em_hw kernel_size) {
    return em_nn_conv2d(in_channels, out_channels, kernel_size);
}
em_module *em_conv2d_module_ex(int64_t in_channels, int64_t out_channels, em_hw kernel_size, em_hw stride,
                               em_hw padding, em_hw dilation, int64_t groups, bool bias) {
    return em_nn_conv2d_ex(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias);
}
em_module *em_max_pool2d_module(em_hw kernel_size, em_hw stride, em_hw padding, em_hw dilation, bool ceil_mode) {
    return em_nn_max_pool2d(kernel_size, stride, padding, dilation, ceil_mode);
}
em_module *em_avg_pool2d_module(em_hw kernel_size, em_hw stride, em_hw padding, bool ceil_mode,
                                bool count_include_pad, int64_t divisor_override) {
    return em_nn_avg_pool2d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override);
}
em_module *em_adaptive_avg_pool2d_module(em_hw output_size) { return em_nn_adaptive_avg_pool2d(output_size); }
em_module *em_layer_norm_module(em_shape normalized_shape, double eps, bool elementwise_affine) {
    return em_nn_layer_norm(normalized_shape, eps, elementwise_affine);
}
em_module *em_batch_norm1d(int64_t num_features) { return em_nn_batch_norm1d(num_features); }
em_module *em_batch_norm2d(int64_t num_features) { return em_nn_batch_norm2d(num_features); }
em_module *em_batch_norm_ex(int spatial_dims, int64_t num_features, double eps, double momentum, bool affine,
                            bool track_running_stats) {
    return em_nn_batch_norm_ex(spatial_dims, num_features, eps, momentum, affine, track_running_stats);
}
em_module *em_embedding_module(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx) {
    return em_nn_embedding(num_embeddings, embedding_dim, padding_idx);
}
em_module *em_multihead_attention(int64_t embed_dim, int64_t num_heads) {
    return em_nn_multihead_attention(embed_dim, num_heads);
}
em_module *em_multihead_attention_ex(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                     bool batch_first) {
    return em_nn_multihead_attention_ex(embed_dim, num_heads, dropout, bias, batch_first);
}
