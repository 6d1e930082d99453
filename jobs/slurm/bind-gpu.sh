#!/bin/bash
# One GPU per rank where the launcher does not bind GPUs itself (mpirun): runs COMMAND with CUDA_VISIBLE_DEVICES
# narrowed to the GPU at this rank's place on its node, the entry at the local rank of the list it inherited
# (Slurm's CUDA_VISIBLE_DEVICES for the job on this node; GPU indices or UUIDs), or the GPU numbered by the
# local rank when none is set. shardtrain then sees one GPU, cuda:0, and matches the ranks' GPUs by identity
# (UUID) to choose NCCL (docs/cluster.md, "GPU binding"). The job scripts use it with GPU_BIND=task.
#     mpirun -np 8 jobs/slurm/bind-gpu.sh build/bin/shardtrain train --config ...
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${MPI_LOCALRANKID:-}}}
if [[ -z "$local_rank" ]]; then
  echo "bind-gpu.sh: no local rank in the environment (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID): start it with mpirun or srun" >&2
  exit 3
fi
if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
  IFS=, read -r -a gpus <<<"$CUDA_VISIBLE_DEVICES"
  if ((local_rank >= ${#gpus[@]})); then
    echo "bind-gpu.sh: local rank $local_rank, but CUDA_VISIBLE_DEVICES=\"$CUDA_VISIBLE_DEVICES\" lists ${#gpus[@]} GPU(s): start one rank per GPU" >&2
    exit 3
  fi
  export CUDA_VISIBLE_DEVICES=${gpus[$local_rank]}
else
  export CUDA_VISIBLE_DEVICES=$local_rank
fi
exec "$@"
