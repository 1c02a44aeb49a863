/* sample_plan.c: not written yet. */
typedef int dh_placeholder_sample_plan_;
