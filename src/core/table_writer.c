/* table_writer.c: not written yet. */
typedef int dh_placeholder_table_writer_;
