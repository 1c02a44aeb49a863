/* desc.c: not written yet. */
typedef int dh_placeholder_desc_;
