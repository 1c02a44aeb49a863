/* index_builder.c: not written yet. */
typedef int dh_placeholder_index_builder_;
