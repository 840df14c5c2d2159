/* `ember train --model gpt` and `ember eval` of its checkpoints: a small decoder-only
 * transformer over the characters (bytes) of a text file. */
#ifndef EMBER_TOOL_MODEL_GPT_H
#define EMBER_TOOL_MODEL_GPT_H

#include <stdbool.h>
#include <stdint.h>
#include <ember/ember.h>

/* ember train with --model gpt among its arguments: parses its own options (gpt_train_options)
 * and trains. */
int gpt_train_main(int argc, char **argv);
extern const struct opt_command gpt_train_options;
/* ember eval of a checkpoint written by `ember train --model gpt` (model_of_file says "gpt"),
 * loaded once by the caller: validation loss on text (NULL: the fortunes) and a sample, on
 * device with threads CPU threads (0: every core). */
int gpt_eval_main(const em_safetensors *f, const char *text, em_device device, int64_t threads);

/* ember mem --model gpt: the estimate for the GPT of that shape (0: the train defaults),
 * with the CPU allocator's measured peak over real steps alongside; ckpt: activation
 * checkpointing per block (ember train --checkpoint-activations); lora_rank > 0: LoRA of that
 * rank on every Linear, the rest frozen. */
typedef struct gpt_mem_args {
    int64_t batch, layers, hidden, seq;
    int lora_rank;
    bool ckpt, json;
} gpt_mem_args;
int gpt_mem_main(const gpt_mem_args *args);

#endif
