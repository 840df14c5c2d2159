/* ember finetune on the tiny model folders: a run stopped by SIGTERM and resumed ends with the
 * same adapters, bit for bit, as one never stopped (across an epoch boundary, with gradient
 * accumulation and a held-out split); layer checkpointing changes no bit; bf16 autocast
 * trains; --merge and generate --adapter give the same text; and the bad inputs (a JSONL line
 * that is not an object, a prompt longer than the context, a target naming no module, an
 * adapter of another base model) fail with a message naming the line or the module. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "test.h"
#include "tool_run.h"

static char g_tmp[64];
static char g_out[1 << 16];

static void write_file(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The whole file as a malloc'ed buffer (*n its size); NULL when unreadable. */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static bool same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    bool same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static int finetune(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/qa.jsonl --seq 32 %s", g_tmp, args);
    int rc = tool_run(cmd, g_out, sizeof g_out);
    return rc;
}

static void test_resume_is_bit_exact(void) {
    const char *common = "--epochs 2 --batch-size 4 --accumulate 2 --lr 1e-2 --eval-fraction 0.1 --seed 3 "
                         "--lora-targets q_proj,v_proj,down_proj --warmup-steps 2";
    char args[1024], a[256], b[256];
    snprintf(args, sizeof args, "%s --out %s/whole", common, g_tmp);
    CHECK(finetune(args) == 0);
    CHECK(strstr(g_out, "step 10/10") != NULL && strstr(g_out, "eval loss") != NULL);
    /* stopped after step 7, in the second epoch */
    snprintf(args, sizeof args, "%s --out %s/stopped --interrupt-after 7", common, g_tmp);
    int rc = finetune(args);
    CHECK(rc == 128 + 15);
    CHECK(strstr(g_out, "stopped by SIGTERM after step 7") != NULL);
    snprintf(a, sizeof a, "%s/stopped/adapter_model.safetensors", g_tmp);
    struct stat st;
    CHECK(stat(a, &st) != 0);   /* no adapters until the run ends */
    snprintf(args, sizeof args, "%s --out %s/stopped --resume", common, g_tmp);
    CHECK(finetune(args) == 0);
    if (!strstr(g_out, "(resumed)") || !strstr(g_out, "step 8/10")) fprintf(stderr, "%s\n", g_out);
    CHECK(strstr(g_out, "(resumed)") != NULL && strstr(g_out, "step 8/10") != NULL && !strstr(g_out, "step 7/10"));
    snprintf(b, sizeof b, "%s/whole/adapter_model.safetensors", g_tmp);
    CHECK(same_file(a, b));
    /* resuming with other options is refused, naming what differs */
    snprintf(args, sizeof args, "%s --out %s/stopped --resume --lora-rank 2", common, g_tmp);
    CHECK(finetune(args) == 1 && strstr(g_out, "another run") != NULL);
}

/* A checkpoint whose position or the optimizer's counts were changed: --resume refuses it, naming
 * what is wrong, and leaves no adapters; the same checkpoint unchanged resumes. */
static void test_forged_resume(void) {
    const char *common = "--max-steps 8 --batch-size 4 --accumulate 2 --seed 1";   /* 10 micro-batches an epoch */
    char args[1024], src[256], dst[256];
    snprintf(args, sizeof args, "%s --out %s/forged --interrupt-after 6", common, g_tmp);
    CHECK(finetune(args) == 128 + 15);   /* step 6: epoch 1, micro-batch 2 */
    snprintf(src, sizeof src, "%s/forged/checkpoint.safetensors", g_tmp);
    snprintf(dst, sizeof dst, "%s/forged/original.safetensors", g_tmp);
    CHECK(rename(src, dst) == 0);
    static const struct { const char *from, *to, *msg; } forged[] = {
        {"\"finetune.epoch\":\"1\"", "\"finetune.epoch\":\"0\"", "puts step 6 at epoch 0, micro-batch 2, where this run"},
        {"\"finetune.micro\":\"2\"", "\"finetune.micro\":\"3\"", "is at epoch 1, micro-batch 2"},
        {"\"finetune.step\":\"6\"", "\"finetune.step\":\"9\"", "is at step 9, past the run's 8 steps"},
        {"\"finetune.step\":\"6\"", "\"finetune.step\":\"\"", "is not a checkpoint of ember finetune"},
        {"\"finetune.epoch\":\"1\"", "\"finetune.epoch\":\" 1\"", "is not a checkpoint of ember finetune"},
        {"\"finetune.epoch\":\"1\"", "\"finetune.epoch\":\"9223372036854775807\"", "is not a checkpoint"},
        {"\"optimizer.steps\":\"6\"", "\"optimizer.steps\":\"9223372036854775807\"", "'optimizer.steps'"},
        {"\"optimizer.steps\":\"6\"", "\"optimizer.steps\":\"5\"", "optimizer.steps is 5, where the position is step 6"},
        {"q_proj.lora_B.weight.step\":\"6\"", "q_proj.lora_B.weight.step\":\"60\"",
         "the optimizer's step count of model.layers.0.self_attn.q_proj.lora_B.weight is 60, where the position is step 6"},
    };
    char adapters[256];
    snprintf(adapters, sizeof adapters, "%s/forged/adapter_model.safetensors", g_tmp);
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        CHECK(tool_edit_safetensors_header(dst, src, forged[i].from, forged[i].to));
        snprintf(args, sizeof args, "%s --out %s/forged --resume", common, g_tmp);
        int rc = finetune(args);
        bool ok = rc == 1 && strstr(g_out, forged[i].msg) != NULL;
        CHECK(ok);
        if (!ok) fprintf(stderr, "  %s -> %s: exit %d, wanted '%s' in:\n%s\n", forged[i].from, forged[i].to, rc,
                         forged[i].msg, g_out);
        struct stat st;
        CHECK(stat(adapters, &st) != 0);
    }
    CHECK(rename(dst, src) == 0);
    snprintf(args, sizeof args, "%s --out %s/forged --resume", common, g_tmp);
    CHECK(finetune(args) == 0 && strstr(g_out, "step 7/8") != NULL);
}

/* A SIGTERM from outside, at whatever point of a step it lands: the run stops after that step
 * and the resumed run still ends on the uninterrupted run's adapters. */
static void test_external_sigterm(void) {
    const char *common = "--max-steps 40 --batch-size 2 --lr 1e-2 --seed 5 --warmup-steps 4";
    char args[1024], log[256], a[256], b[256];
    snprintf(args, sizeof args, "%s --out %s/ext_whole", common, g_tmp);
    CHECK(finetune(args) == 0);
    snprintf(log, sizeof log, "%s/ext.log", g_tmp);
    pid_t pid = fork();
    if (pid == 0) {
        char data[256], out[256];
        snprintf(data, sizeof data, "%s/qa.jsonl", g_tmp);
        snprintf(out, sizeof out, "%s/ext_stopped", g_tmp);
        if (!freopen(log, "w", stderr)) _exit(99);
        execl(tool_path(), "ember", "finetune", "tests/data/models/llama", "--data", data, "--seq", "32",
              "--max-steps", "40", "--batch-size", "2", "--lr", "1e-2", "--seed", "5", "--warmup-steps", "4", "--out",
              out, (char *)NULL);
        _exit(98);
    }
    CHECK(pid > 0);
    if (pid <= 0) return;
    /* wait for the second step's line, then stop it */
    bool seen = false;
    for (int i = 0; i < 2000 && !seen; i++) {
        size_t n = 0;
        unsigned char *text = slurp(log, &n);
        if (text) {
            text[n] = '\0';
            seen = strstr((char *)text, "step 2/40") != NULL;
            free(text);
        }
        if (!seen) usleep(10000);
    }
    CHECK(seen);
    kill(pid, SIGTERM);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    bool stopped = WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM;
    bool finished = WIFEXITED(st) && WEXITSTATUS(st) == 0;   /* the signal came after the last step */
    if (!stopped && !finished) {   /* say how it ended, with the end of its log */
        size_t n = 0;
        unsigned char *text = slurp(log, &n);
        if (text) text[n] = '\0';
        fprintf(stderr, "  the stopped run ended with %s %d; its log ends:\n%s\n", WIFEXITED(st) ? "status" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? WTERMSIG(st) : -1,
                text ? (char *)text + (n > 600 ? n - 600 : 0) : "(unreadable)");
        free(text);
    }
    CHECK(stopped || finished);
    if (stopped) {
        snprintf(args, sizeof args, "%s --out %s/ext_stopped --resume", common, g_tmp);
        CHECK(finetune(args) == 0);
    }
    snprintf(a, sizeof a, "%s/ext_whole/adapter_model.safetensors", g_tmp);
    snprintf(b, sizeof b, "%s/ext_stopped/adapter_model.safetensors", g_tmp);
    CHECK(same_file(a, b));
}

static void test_checkpointing_changes_no_bit(void) {
    char cmd[1024], a[256], b[256];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        snprintf(cmd, sizeof cmd, "finetune tests/data/models/gpt2 --data %s/text.txt --seq 24 --batch-size 2 "
                 "--max-steps 3 --lora-targets c_attn,c_fc --out %s/text%d%s", g_tmp, g_tmp, ckpt,
                 ckpt ? " --checkpoint-activations" : "");
        int rc = tool_run(cmd, g_out, sizeof g_out);
        if (rc) fprintf(stderr, "%s\n", g_out);
        CHECK(rc == 0);
    }
    snprintf(a, sizeof a, "%s/text0/adapter_model.safetensors", g_tmp);
    snprintf(b, sizeof b, "%s/text1/adapter_model.safetensors", g_tmp);
    CHECK(same_file(a, b));
}

static void test_amp_merge_and_generate(void) {
    char args[512], cmd[1024], with_adapter[4096];
    snprintf(args, sizeof args, "--max-steps 2 --amp bf16 --lr 1e-2 --merge --out %s/amp", g_tmp);
    CHECK(finetune(args) == 0);
    CHECK(strstr(g_out, "step 2/2") != NULL && !strstr(g_out, "loss nan"));
    snprintf(cmd, sizeof cmd, "generate tests/data/models/llama --prompt 'Question 1' --max-new-tokens 6 --json "
             "--adapter %s/amp 2>/dev/null", g_tmp);
    CHECK(tool_run(cmd, with_adapter, sizeof with_adapter) == 0);
    snprintf(cmd, sizeof cmd, "generate %s/amp/merged --prompt 'Question 1' --max-new-tokens 6 --json 2>/dev/null",
             g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 0);
    const char *t1 = strstr(with_adapter, "\"tokens\""), *t2 = strstr(g_out, "\"tokens\"");
    CHECK(t1 && t2 && !strncmp(t1, t2, (size_t)(strstr(t1, "]") - t1)));
    /* the adapter of a Llama on GPT-2 */
    snprintf(cmd, sizeof cmd, "generate tests/data/models/gpt2 --prompt x --adapter %s/amp", g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1);
    CHECK(strstr(g_out, "'q_proj' matches no module of GPT2LMHeadModel") != NULL);
}

static void test_bad_inputs(void) {
    char args[512];
    write_file("bad.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n\n[\"not\", \"an object\"]\n");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/bad.jsonl --out %s/bad", g_tmp, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1);
    CHECK(strstr(g_out, "bad.jsonl:3: expected a JSON object") != NULL);
    write_file("long.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                             "{\"prompt\": \"a prompt of many many many words, longer than eight tokens\", "
                             "\"completion\": \"b\"}\n");
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/long.jsonl --seq 8 --out %s/bad", g_tmp,
             g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1);
    CHECK(strstr(g_out, "long.jsonl:2: the prompt is") != NULL);
    write_file("nostring.jsonl", "{\"prompt\": 3, \"completion\": \"b\"}\n");
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/nostring.jsonl --out %s/bad", g_tmp, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "nostring.jsonl:1: \"prompt\" and") != NULL);
    snprintf(args, sizeof args, "--max-steps 1 --lora-targets q_proj,c_fc --out %s/bad", g_tmp);
    CHECK(finetune(args) == 1);
    CHECK(strstr(g_out, "LoRA target 'c_fc' matches no module of LlamaForCausalLM") != NULL);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/qa.jsonl --seq 4096 --out %s/bad", g_tmp, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "exceeds the model's context") != NULL);
    snprintf(args, sizeof args, "--epochs 1 --max-steps 2 --out %s/bad", g_tmp);
    CHECK(finetune(args) == 2);
    CHECK(tool_run("finetune tests/data/models/llama --out /tmp/x", g_out, sizeof g_out) == 2);
    snprintf(args, sizeof args, "--out %s/never --resume", g_tmp);
    CHECK(finetune(args) == 1 && strstr(g_out, "--resume") != NULL);
    /* JSONL as datasets write it: a byte-order mark, members besides the two holding any JSON */
    write_file("meta.jsonl", "\xEF\xBB\xBF{\"prompt\": \"a\", \"completion\": \"b\", \"meta\": {\"src\": [\"x\", -2.5e3, "
                             "true, null, {}]}}\n{\"id\": 7, \"prompt\": \"c\", \"completion\": \"d\\u0000e\"}\n");
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/meta.jsonl --max-steps 1 --out %s/meta", g_tmp,
             g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 0 && strstr(g_out, "2 training examples") != NULL);
    /* what Python's json would not read, or would read otherwise, named by line */
    static const struct { const char *name, *text, *msg; } bad_jsonl[] = {
        {"dup.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\", \"prompt\": \"c\"}\n", "dup.jsonl:1: \"prompt\" is given twice"},
        {"surrogate.jsonl", "\n{\"prompt\": \"\\ud800\", \"completion\": \"b\"}\n", "surrogate.jsonl:2: a string is not valid JSON"},
        {"number.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\", \"n\": +1}\n", "number.jsonl:1: a member's value is not"},
        {"trailing.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"} x\n", "trailing.jsonl:1: text after the object"},
    };
    for (size_t i = 0; i < sizeof bad_jsonl / sizeof bad_jsonl[0]; i++) {
        write_file(bad_jsonl[i].name, bad_jsonl[i].text);
        snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/%s --out %s/bad", g_tmp, bad_jsonl[i].name,
                 g_tmp);
        CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, bad_jsonl[i].msg) != NULL);
    }
    char deep[1200] = "{\"prompt\": \"a\", \"completion\": \"b\", \"x\": ";
    for (int i = 0; i < 300; i++) strcat(deep, "[");
    for (int i = 0; i < 300; i++) strcat(deep, "]");
    strcat(deep, "}\n");
    write_file("deep.jsonl", deep);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s/deep.jsonl --out %s/bad", g_tmp, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "deep.jsonl:1: a member's value nests") != NULL);
    /* a NUL byte after the first object: the lines after it were dropped unseen */
    char path[256];
    snprintf(path, sizeof path, "%s/nul.jsonl", g_tmp);
    FILE *f = fopen(path, "wb");
    static const char with_nul[] = "{\"prompt\": \"a\", \"completion\": \"b\"}\0x\n{\"prompt\": 1}\n";
    CHECK(f && fwrite(with_nul, 1, sizeof with_nul - 1, f) == sizeof with_nul - 1);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s --out %s/bad", path, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "nul.jsonl:1: a NUL byte") != NULL);
    /* a stream without an end is read to the limit, not until memory runs out; a folder is no file */
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data /dev/zero --out %s/bad", g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "/dev/zero: not a regular file, and it goes on "
                                                                    "past 1073741824 bytes") != NULL);
    snprintf(cmd, sizeof cmd, "finetune tests/data/models/llama --data %s --out %s/bad", g_tmp, g_tmp);
    CHECK(tool_run(cmd, g_out, sizeof g_out) == 1 && strstr(g_out, "is a folder, not a file") != NULL);
}

int main(void) {
    if (!tool_path()) {
        test_skip_case("ember finetune", "build/ember is missing");
        return test_summary();
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/ember_tool_finetune_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    /* 40 prompt/completion pairs, and a text of a few hundred tokens */
    char *qa = malloc(1 << 14), *text = malloc(1 << 14);
    if (!qa || !text) return 1;
    size_t n = 0, m = 0;
    for (int i = 0; i < 40; i++) {
        n += (size_t)snprintf(qa + n, (1 << 14) - n, "{\"prompt\": \"Question %d: what is %d plus %d?\", "
                              "\"completion\": \" The answer is %d.\", \"id\": %d}\n", i, i, i + 1, 2 * i + 1, i);
        m += (size_t)snprintf(text + m, (1 << 14) - m, "Line %d of a plain text, with words to learn. ", i);
    }
    write_file("qa.jsonl", qa);
    write_file("text.txt", text);
    free(qa);
    free(text);
    RUN(test_resume_is_bit_exact);
    RUN(test_forged_resume);
    RUN(test_external_sigterm);
    RUN(test_checkpointing_changes_no_bit);
    RUN(test_amp_merge_and_generate);
    RUN(test_bad_inputs);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    CHECK(system(cmd) == 0);
    return test_summary();
}
