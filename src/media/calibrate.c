/* calibrate.c: not written yet. */
typedef int dh_placeholder_calibrate_;
