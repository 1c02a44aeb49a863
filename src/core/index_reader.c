/* index_reader.c: not written yet. */
typedef int dh_placeholder_index_reader_;
