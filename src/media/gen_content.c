/* gen_content.c: not written yet. */
typedef int dh_placeholder_gen_content_;
