/* tokens.c: not written yet. */
typedef int dh_placeholder_tokens_;
