/* gen_encode.c: not written yet. */
typedef int dh_placeholder_gen_encode_;
