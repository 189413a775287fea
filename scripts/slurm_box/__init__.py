"""A SLURM cluster on one box: munge, slurmctld and N slurmd, each daemon in its own network + UTS
namespace on a bridge with no route out, all state under one directory that `down` removes."""
