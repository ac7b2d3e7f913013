import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ddpdoctor as dd

if dd.is_distributed() and not dist.is_initialized():  # torchrun, srun, mpirun: all understood
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

dd.seed_everything(1234)                  # same weights on every rank; per_rank=True for augmentation
with dd.zero_first():                     # rank 0 downloads / preprocesses first, the others then reuse it
    dataset = TensorDataset(torch.linspace(-1, 1, 103 * 8).reshape(103, 8), torch.arange(103) % 2)

model = torch.nn.Linear(8, 2)
dd.assert_in_sync(model)                  # DesyncError, naming the tensor and the ranks, if weights differ
sampler = DistributedSampler(dataset, num_replicas=dd.get_world_size(), rank=dd.get_rank(), shuffle=True)
predictions = []
with torch.no_grad():
    for x, _ in DataLoader(dataset, batch_size=16, sampler=sampler):
        predictions.append(model(x).argmax(1))
# Every rank gets all 103 predictions in dataset order, padding duplicates removed.
predictions = dd.gather_for_metrics(torch.cat(predictions), sampler)
accuracy = (predictions == dataset.tensors[1]).float().mean().item()
totals = dd.reduce_dict({"samples": len(sampler)}, average=False)   # valid on every rank
dd.print0(f"accuracy {accuracy:.4f} on {len(predictions)} samples")  # printed once per job
dd.barrier()
