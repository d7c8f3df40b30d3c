/* driver.c: a main() for the fuzz harnesses where libFuzzer is not available (gcc builds): replays
 * every file of the corpus directories given, then, with -max_total_time=S, feeds mutations of them
 * (bit flips, byte changes, insertions, deletions, truncations, splices) until S seconds have
 * passed. Same command line as libFuzzer (other -flags are ignored). Before each mutated input is
 * run it is saved to <artifact_prefix>last-input, so a crash can be replayed. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fuzz_util.h"

#define DRIVER_MAX_INPUT (1 << 20)
#define MAX_FILES 4096

typedef struct {
  uint8_t *data;
  size_t size;
} input;

static input corpus[MAX_FILES];
static int n_corpus;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) { /* xorshift64 */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void load_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f || n_corpus == MAX_FILES) {
    if (f) fclose(f);
    return;
  }
  input *in = &corpus[n_corpus];
  in->data = malloc(DRIVER_MAX_INPUT);
  in->size = in->data ? fread(in->data, 1, DRIVER_MAX_INPUT, f) : 0;
  fclose(f);
  if (in->data) n_corpus++;
}

static void load(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    load_file(path);
    return;
  }
  DIR *d = opendir(path);
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    load(p);
  }
  if (d) closedir(d);
}

/* One random edit of buf (size *n, capacity DRIVER_MAX_INPUT). */
static void mutate(uint8_t *buf, size_t *n) {
  const size_t size = *n;
  const size_t at = size ? rnd() % size : 0;
  switch (rnd() % 7) {
    case 0: if (size) buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
    case 1: if (size) buf[at] = (uint8_t)rnd(); break;
    case 2: if (size) buf[at] = "0123456789-+.e\"{}[],:\n"[rnd() % 23]; break;
    case 3:
      if (size < DRIVER_MAX_INPUT) {
        memmove(buf + at + 1, buf + at, size - at);
        buf[at] = (uint8_t)rnd();
        ++*n;
      }
      break;
    case 4: if (size) { memmove(buf + at, buf + at + 1, size - at - 1); --*n; } break;
    case 5: *n = size ? rnd() % size : 0; break;
    default: { /* splice a piece of another corpus input */
      const input *o = &corpus[rnd() % n_corpus];
      if (!o->size) break;
      const size_t from = rnd() % o->size, len = 1 + rnd() % (o->size - from);
      if (at + len <= DRIVER_MAX_INPUT) {
        memcpy(buf + at, o->data + from, len);
        if (at + len > *n) *n = at + len;
      }
    }
  }
}

int main(int argc, char **argv) {
  double seconds = 0;
  const char *prefix = "./";
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "-max_total_time=", 16)) seconds = atof(argv[i] + 16);
    else if (!strncmp(argv[i], "-seed=", 6)) rng_state = strtoull(argv[i] + 6, NULL, 10) | 1;
    else if (!strncmp(argv[i], "-artifact_prefix=", 17)) prefix = argv[i] + 17;
    else if (argv[i][0] != '-') load(argv[i]);
  }
  for (int i = 0; i < n_corpus; i++) LLVMFuzzerTestOneInput(corpus[i].data, corpus[i].size);
  long runs = n_corpus;
  char last[1024];
  snprintf(last, sizeof last, "%slast-input", prefix);
  uint8_t *buf = malloc(DRIVER_MAX_INPUT);
  const time_t end = time(NULL) + (time_t)seconds;
  while (buf && n_corpus && seconds > 0 && time(NULL) < end) {
    const input *base = &corpus[rnd() % n_corpus];
    size_t n = base->size;
    memcpy(buf, base->data, n);
    for (int k = 1 + (int)(rnd() % 4); k > 0; k--) mutate(buf, &n);
    FILE *f = fopen(last, "wb");
    if (f) {
      fwrite(buf, 1, n, f);
      fclose(f);
    }
    LLVMFuzzerTestOneInput(buf, n);
    runs++;
  }
  remove(last);
  printf("Done %ld runs (%d corpus inputs replayed, then mutations for %.0f s)\n", runs, n_corpus, seconds);
  free(buf);
  return 0;
}
