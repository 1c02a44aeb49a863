/* gen_data.c: not written yet. */
typedef int dh_placeholder_gen_data_;
