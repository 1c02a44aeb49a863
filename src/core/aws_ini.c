/*
 * aws_ini.c - AWS config and credentials files (see aws_ini.h).  Pure.
 */
#include "core/aws_ini.h"

#include <stdio.h>
#include <string.h>

static int blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* [a, b) with blanks trimmed on both sides. */
static void trim(const char **a, const char **b)
{
    while (*a < *b && blank(**a))
        (*a)++;
    while (*b > *a && blank((*b)[-1]))
        (*b)--;
}

static int equals(const char *a, const char *b, const char *s)
{
    return (size_t)(b - a) == strlen(s) && !memcmp(a, s, (size_t)(b - a));
}

int dh__aws_ini_get(const char *text, const char *section, const char *key,
                    char *out, size_t cap)
{
    const char *dot = strchr(key, '.');
    char parent[64] = "";
    const char *leaf = key;
    int in_section = 0, in_parent = 0, found = 0;

    if (dot && (size_t)(dot - key) < sizeof(parent)) {
        memcpy(parent, key, (size_t)(dot - key));
        parent[dot - key] = '\0';
        leaf = dot + 1;
    }
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        const char *a = line, *b = end ? end : line + strlen(line), *eq;
        int indented = blank(*a) && *a != '\r';

        line = end ? end + 1 : NULL;
        trim(&a, &b);
        if (a == b || *a == '#' || *a == ';')
            continue;
        if (*a == '[') {
            const char *c = memchr(a, ']', (size_t)(b - a));
            const char *s = a + 1;

            if (!c)
                continue;
            trim(&s, &c);
            in_section = equals(s, c, section);
            in_parent = 0;
            continue;
        }
        if (!in_section || !(eq = memchr(a, '=', (size_t)(b - a))))
            continue;
        {
            const char *ka = a, *kb = eq, *va = eq + 1, *vb = b;

            trim(&ka, &kb);
            trim(&va, &vb);
            if (!indented) {
                /* "s3 =" with nothing after it opens nested settings */
                in_parent = parent[0] && va == vb && equals(ka, kb, parent);
                if (!parent[0] && equals(ka, kb, key)) {
                    snprintf(out, cap, "%.*s", (int)(vb - va), va);
                    found = 1;
                }
            } else if (in_parent && equals(ka, kb, leaf)) {
                snprintf(out, cap, "%.*s", (int)(vb - va), va);
                found = 1;
            }
        }
    }
    return found;
}
