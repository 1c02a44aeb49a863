/* table_reader.c: not written yet. */
typedef int dh_placeholder_table_reader_;
