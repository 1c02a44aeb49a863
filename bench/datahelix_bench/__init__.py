"""datahelix_bench: `datahelix bench` / `make bench-live`, data-loading
systems side by side in one run, under the same CPU budget, measured with
the paper's metrics (Sec. 5.1).

`datahelix bench ARGS` runs `python3 -m datahelix_bench ARGS` with its
arguments unparsed (src/cli/cmd_bench.c): this package checks them, in
cli.py alone.

Every system runs R training-rank processes (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT, a fresh port per system).  Each rank, per step:
takes its batch (input wait = time blocked in next()), holds a GPU window
emulated by time.sleep() (no CPU burnt) whose length comes from the batch
under the chosen model, then a real torch.distributed all_reduce (gloo) of
a small tensor, so the wait for the slowest rank is real.  Warm-up steps
are left out of every metric.

Modules, in the order a run uses them:
  cli         arguments: parsing, every check, --help (the one place that
              validates); main()
  harness     one run: CPU pinning, data, each system in turn, results
  data        the run's clips, manifest and index (gen-data, probe, index)
  processes   rank processes and services (Coordinator, Dask cluster):
              started, watched with bounded waits, ended by pid
  rank        a rank's entry point (`python3 -m datahelix_bench.rank CFG`)
  sources     the loaders compared: torch DataLoader (C or PyAV decode),
              a Dask pool, datahelix.DataLoader
  window      the emulated GPU window of a batch under --model
  cpuacct     where the run's CPU went, by process kind (/proc), sampled
              while the ranks run
  metrics     the paper's metrics from the ranks' step records, the
              ceiling and each system's share of it
  validate    --validate: the same configuration in `datahelix sim`
  report      tables, comparisons and plots
"""
