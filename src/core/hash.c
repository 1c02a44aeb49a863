/* hash.c: not written yet. */
typedef int dh_placeholder_hash_;
