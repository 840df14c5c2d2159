/* A tiny GPT in C: a decoder-only transformer that learns to continue a text character by
 * character. Token + position embeddings, two pre-norm blocks (causal self-attention and an
 * MLP, each with a residual), a final LayerNorm and a linear head; AdamW on the next
 * character's cross-entropy. The same model as `ember train --model gpt`, written out.
 *
 *   build/example_gpt_chars [steps] [file]     (default: 40 steps on the rhyme below)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ember/ember.h>

#define CONTEXT 32
#define D_MODEL 64
#define HEADS 4
#define LAYERS 2
#define BATCH 16

static const char *rhyme =
    "Twinkle, twinkle, little star, how I wonder what you are.\n"
    "Up above the world so high, like a diamond in the sky.\n"
    "When the blazing sun is gone, when he nothing shines upon,\n"
    "then you show your little light, twinkle, twinkle, all the night.\n";

typedef struct gpt {
    em_module *tok, *pos, *ln1[LAYERS], *attn[LAYERS], *ln2[LAYERS], *mlp[LAYERS], *ln_f, *head;
    em_module *all; /* owns every layer above, so that one optimizer sees every parameter */
} gpt;

static em_tensor *forward(gpt *g, em_tensor *idx) { /* [B, T] -> logits [B, T, vocab] */
    int64_t T = em_size(idx, 1);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_OPTS(.dtype = EM_I64));
    em_tensor *x = em_add(em_forward(g->tok, idx), em_forward(g->pos, pos));
    for (int l = 0; l < LAYERS; l++) {
        em_tensor *h = em_forward(g->ln1[l], x);
        x = em_add(x, em_multihead_attention_forward(g->attn[l], h, h, h, NULL, true, NULL)); /* causal */
        x = em_add(x, em_forward(g->mlp[l], em_forward(g->ln2[l], x)));
    }
    return em_forward(g->head, em_forward(g->ln_f, x));
}

static em_module *keep(gpt *g, const char *name, em_module *m) {
    em_module_add_child(g->all, name, m); /* owned by g->all from here on */
    return m;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 40;
    char *text = (char *)rhyme;
    if (argc > 2) { /* a text file of your own */
        FILE *f = fopen(argv[2], "rb");
        if (!f) return perror(argv[2]), 1;
        text = calloc(1 << 20, 1);
        size_t n = fread(text, 1, (1 << 20) - 1, f);
        fclose(f);
        text[n] = '\0';
    }
    int64_t n = (int64_t)strlen(text);
    /* the vocabulary: every character that occurs */
    int id[256], vocab = 0;
    char chars[256];
    for (int c = 0; c < 256; c++) id[c] = -1;
    for (int64_t i = 0; i < n; i++)
        if (id[(unsigned char)text[i]] < 0) chars[vocab] = text[i], id[(unsigned char)text[i]] = vocab++;

    em_manual_seed(0);
    gpt g = {.all = em_nn_sequential_n(0, NULL)};
    g.tok = keep(&g, "tok", em_nn_embedding(vocab, D_MODEL, EM_NO_PADDING_IDX));
    g.pos = keep(&g, "pos", em_nn_embedding(CONTEXT, D_MODEL, EM_NO_PADDING_IDX));
    for (int l = 0; l < LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "ln1_%d", l), g.ln1[l] = keep(&g, name, em_nn_layer_norm(EM_SHAPE(D_MODEL), 1e-5, true));
        snprintf(name, sizeof name, "attn_%d", l), g.attn[l] = keep(&g, name, em_nn_multihead_attention_ex(D_MODEL, HEADS, 0.0, true, true));
        snprintf(name, sizeof name, "ln2_%d", l), g.ln2[l] = keep(&g, name, em_nn_layer_norm(EM_SHAPE(D_MODEL), 1e-5, true));
        snprintf(name, sizeof name, "mlp_%d", l);
        g.mlp[l] = keep(&g, name, em_nn_sequential(em_nn_linear(D_MODEL, 4 * D_MODEL), em_nn_gelu(), em_nn_linear(4 * D_MODEL, D_MODEL)));
    }
    g.ln_f = keep(&g, "ln_f", em_nn_layer_norm(EM_SHAPE(D_MODEL), 1e-5, true));
    g.head = keep(&g, "head", em_nn_linear(D_MODEL, vocab));
    em_optimizer *opt = em_adamw(g.all, 3e-3);
    if (em_failed()) return fprintf(stderr, "%s\n", em_last_error()), 1;
    printf("GPT: %d characters of vocabulary, %lld parameters\n", vocab, (long long)em_module_num_parameters(g.all));

    int64_t tokens[BATCH * (CONTEXT + 1)];
    double first = 0, loss_now = 0;
    for (int step = 1; step <= steps; step++) {
        em_scope s = em_scope_begin();
        for (int b = 0; b < BATCH; b++) { /* random windows of CONTEXT + 1 characters */
            int64_t at = rand() % (n - CONTEXT - 1);
            for (int t = 0; t <= CONTEXT; t++) tokens[b * (CONTEXT + 1) + t] = id[(unsigned char)text[at + t]];
        }
        em_tensor *batch = em_from_data(tokens, EM_I64, EM_SHAPE(BATCH, CONTEXT + 1), EM_OPTS(.dtype = EM_I64));
        em_tensor *x = em_narrow(batch, 1, 0, CONTEXT), *y = em_narrow(batch, 1, 1, CONTEXT);
        em_tensor *logits = forward(&g, em_contiguous(x));
        em_tensor *loss = em_cross_entropy(em_reshape(logits, EM_SHAPE(-1, vocab)), em_reshape(y, EM_SHAPE(-1)), 0.0);
        em_zero_grad(opt);
        em_backward(loss);
        em_step(opt);
        loss_now = em_item(loss);
        if (step == 1) first = loss_now;
        if (step % 10 == 0 || step == steps) printf("step %3d: loss %.3f\n", step, loss_now);
        em_scope_end(s);
        if (em_failed()) return fprintf(stderr, "%s\n", em_last_error()), 1;
    }

    /* sampling: the most likely next character, one at a time */
    int64_t ctx[CONTEXT] = {id[(unsigned char)text[0]]};
    int len = 1;
    printf("sample: %c", text[0]);
    em_grad_mode gm = em_no_grad_begin();
    for (int i = 0; i < 60; i++) {
        em_scope s = em_scope_begin();
        em_tensor *logits = forward(&g, em_from_data(ctx, EM_I64, EM_SHAPE(1, len), EM_OPTS(.dtype = EM_I64)));
        int64_t next = (int64_t)em_item(em_argmax(em_select(em_select(logits, 0, 0), 0, len - 1), 0, false));
        em_scope_end(s);
        putchar(chars[next]);
        if (len == CONTEXT) memmove(ctx, ctx + 1, (CONTEXT - 1) * sizeof ctx[0]), len--;
        ctx[len++] = next;
    }
    em_no_grad_end(gm);
    printf("\n");
    em_optim_free(opt);
    em_module_free(g.all);
    if (text != rhyme) free(text);
    /* a few steps must already have lowered the loss */
    return steps >= 20 && !(loss_now < first) ? 1 : 0;
}
