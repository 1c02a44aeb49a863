/*
 * replay_main.c - runs a libFuzzer target over every file of a corpus
 * directory (argv[1]) without libFuzzer, so `ctest` replays the corpus and
 * past crash inputs on every build (with any compiler).
 */
#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;

    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0) {
        fclose(f);
        return -1;
    }
    rewind(f);
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    char path[4096];
    struct dirent *de;
    struct stat st;
    long count = 0;
    DIR *d;

    if (argc != 2 || !(d = opendir(argv[1]))) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    while ((de = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", argv[1], de->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (replay_file(path) != 0) {
            fprintf(stderr, "%s: cannot read\n", path);
            closedir(d);
            return 1;
        }
        count++;
    }
    closedir(d);
    printf("%ld inputs replayed\n", count);
    return count > 0 ? 0 : 1;
}
