/* probe_walk.c: not written yet. */
typedef int dh_placeholder_probe_walk_;
