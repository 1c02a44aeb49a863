/* costmodel.c: not written yet. */
typedef int dh_placeholder_costmodel_;
