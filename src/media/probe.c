/* probe.c: not written yet. */
typedef int dh_placeholder_probe_;
