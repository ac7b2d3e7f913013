"""Write the corpus: one log per case under ``cases/`` and the table ``cases.tsv``.

Each case below is a failure a user reported in a public issue thread whose cause the thread
settled; ``source`` names the repository and issue. The log is written from the facts of that
thread (the versions, launcher, counts, names and settings it reports), with the message texts the
libraries print (PyTorch/NCCL/gloo source, or produced on CPU where possible), framed the way the
launcher frames it (``frames.py``). Users' logs are not copied.

Run it to regenerate the files after editing a case (``python tests/explain_corpus/compose.py``);
the committed logs and table are what the test reads. Held-out cases (every fifth, by position,
fixed before any pattern was written for the corpus) are marked in the table.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from frames import (
    CONDA,
    SITE,
    deepspeed,
    launch_legacy,
    lightning_banner,
    nccl_info,
    slurm,
    spawn,
    tb,
    torchrun,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CASES: list = []


def add(slug, expect, fix, source, kind, launcher, log, alt=(), related=()):
    CASES.append(dict(slug=slug, expect=expect, alt=",".join(alt), related=",".join(related), fix=fix,
                      source=source, kind=kind, launcher=launcher, log=log))


def U(line, func, code, script="train.py", root="/workspace"):
    return (f"{root}/{script}", line, func, code)


INIT = [("torch/distributed/c10d_logger.py", 79, "wrapper", "return func(*args, **kwargs)"),
        ("torch/distributed/distributed_c10d.py", 1520, "init_process_group",
         "store, rank, world_size = next(rendezvous_iterator)")]
INIT_OLD = [("torch/distributed/distributed_c10d.py", 500, "init_process_group",
             "store, rank, world_size = next(rendezvous_iterator)")]
ENV_RDZV = [("torch/distributed/rendezvous.py", 265, "_env_rendezvous_handler",
             "store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout, use_libuv)"),
            ("torch/distributed/rendezvous.py", 194, "_create_c10d_store",
             "return TCPStore(")]
DDP_INIT = [("torch/nn/parallel/distributed.py", 822, "__init__",
             "_verify_param_shape_across_processes(self.process_group, parameters)"),
            ("torch/distributed/utils.py", 286, "_verify_param_shape_across_processes",
             "return dist._verify_params_across_processes(process_group, tensors, logger)")]
BACKWARD = [("torch/_tensor.py", 525, "backward", "torch.autograd.backward("),
            ("torch/autograd/__init__.py", 267, "backward", "_engine_run_backward("),
            ("torch/autograd/graph.py", 744, "_engine_run_backward",
             "return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass")]
DDP_FWD = [("torch/nn/modules/module.py", 1532, "_wrapped_call_impl", "return self._call_impl(*args, **kwargs)"),
           ("torch/nn/modules/module.py", 1541, "_call_impl", "return forward_call(*args, **kwargs)"),
           ("torch/nn/parallel/distributed.py", 1589, "forward", "inputs, kwargs = self._pre_forward(*inputs, **kwargs)"),
           ("torch/nn/parallel/distributed.py", 1478, "_pre_forward",
            "if torch.is_grad_enabled() and self.reducer._rebuild_buckets():")]

NCCL_KIND = {
    "system": ("unhandled system error (run with NCCL_DEBUG=INFO for details)",
               "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. "),
    "internal": ("internal error - please report this issue to the NCCL developers",
                 "ncclInternalError: Internal check failed."),
    "usage": ("invalid usage (run with NCCL_DEBUG=WARN for details)",
              "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."),
    "remote": ("remote process exited or there was a network error",
               "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely."),
}


def nccl_exc(kind, last, ver="2.19.3", where="../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1691"):
    what, desc = NCCL_KIND[kind]
    return (f"torch.distributed.DistBackendError: NCCL error in: {where}, {what}, NCCL version {ver}\n"
            f"{desc}\nLast error:\n{last}")


def nccl_exc_old(kind, ver="2.7.8", where="/pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784"):
    what = {"system": "unhandled system error", "internal": "internal error", "usage": "invalid usage",
            "remote": "remote process exited or there was a network error"}[kind]
    return f"RuntimeError: NCCL error in: {where}, {what}, NCCL version {ver}"


# --------------------------------------------------------------------------------------------
# Version and build mismatches
# --------------------------------------------------------------------------------------------

ARCH_OLD = ("{gpu} with CUDA capability sm_86 is not compatible with the current PyTorch installation.\n"
            "The current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70.\n"
            "If you want to use the {gpu} GPU with PyTorch, please check the instructions at "
            "https://pytorch.org/get-started/locally/\n")

add("cuda-arch-sm86-a6000", "cuda-arch-unsupported",
    "install a PyTorch wheel built for sm_86 (CUDA 11.1+ build, e.g. torch==1.10 +cu113)",
    "nerfstudio-project/nerfacc#80", "version", "torchrun",
    [f"{SITE}/torch/cuda/__init__.py:143: UserWarning: "] + ARCH_OLD.format(gpu="NVIDIA RTX A6000").splitlines()
    + ["  warnings.warn(incompatible_device_warn.format(device_name, capability, \" \".join(arch_list), device_name))"]
    + torchrun({0: tb([U(41, "<module>", "model = NGPModel().to(device)"),
                       ("torch/nn/modules/module.py", 927, "to", "return self._apply(convert)"),
                       ("torch/nn/modules/module.py", 602, "_apply", "param_applied = fn(param)")],
                      "RuntimeError: CUDA error: no kernel image is available for execution on the device\n"
                      "CUDA kernel errors might be asynchronously reported at some other API call,so the stacktrace "
                      "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1.")},
               0, 1, fmt="old", script="examples/train_ngp_nerf.py"))

add("cuda-arch-a100-old-wheel", "cuda-arch-unsupported",
    "install a CUDA 11 build of PyTorch (sm_80 needs CUDA 11.0+ wheels, e.g. torch 1.7.1+cu110)",
    "pytorch/pytorch#45028", "version", "python",
    [f"{CONDA}/torch/cuda/__init__.py:104: UserWarning: ",
     "A100-SXM4-40GB with CUDA capability sm_80 is not compatible with the current PyTorch installation.",
     "The current PyTorch install supports CUDA capabilities sm_37 sm_50 sm_60 sm_70.",
     "If you want to use the A100-SXM4-40GB GPU with PyTorch, please check the instructions at "
     "https://pytorch.org/get-started/locally/", "",
     "  warnings.warn(incompatible_device_warn.format(device_name, capability, \" \".join(arch_list), device_name))"]
    + tb([U(18, "main", "x = torch.randn(8, 8, device='cuda')", "check_gpu.py")],
         "RuntimeError: CUDA error: no kernel image is available for execution on the device", site=CONDA))

add("cuda-arch-sm120-rtx5090", "cuda-arch-unsupported",
    "install a PyTorch build with CUDA 12.8+ (the cu128 wheels) that includes sm_120",
    "pytorch/pytorch#150733", "version", "torchrun",
    torchrun({0: [f"{SITE}/torch/cuda/__init__.py:235: UserWarning: ",
                  "NVIDIA GeForce RTX 5090 D with CUDA capability sm_120 is not compatible with the current PyTorch "
                  "installation.",
                  "The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.",
                  "If you want to use the NVIDIA GeForce RTX 5090 D GPU with PyTorch, please check the instructions "
                  "at https://pytorch.org/get-started/locally/", ""]
              + tb([U(57, "setup", "torch.cuda.set_device(local_rank)"), U(112, "<module>", "setup()")],
                   "torch.AcceleratorError: CUDA error: no kernel image is available for execution on the device\n"
                   "Search for `cudaErrorNoKernelImageForDevice' in "
                   "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.")},
             0, 1))

add("gpu-too-old-titan-black", "cuda-arch-unsupported",
    "the GPU (compute capability 3.5) is below what the PyTorch wheels support: build PyTorch from "
    "source or use a newer GPU (or run on CPU)",
    "AUTOMATIC1111/stable-diffusion-webui#3003", "version", "mp.spawn",
    spawn(1, tb([("/home/user/project/train.py", 64, "main_worker", "model.cuda(gpu)"),
                 ("torch/nn/modules/module.py", 905, "cuda", "return self._apply(lambda t: t.cuda(device))")],
                "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
          pre=[f"{SITE}/torch/cuda/__init__.py:152: UserWarning: ",
               "    Found GPU0 NVIDIA GTX TITAN Black which is of cuda capability 3.5.",
               "    PyTorch no longer supports this GPU because it is too old.",
               "    The minimum cuda capability supported by this library is 3.7.", "    ",
               "  warnings.warn(old_gpu_warn % (d, name, major, minor, min_arch // 10, min_arch % 10))"]))

add("cuda-arch-a6000-compute37", "cuda-arch-unsupported",
    "reinstall PyTorch with a CUDA 11.1+ build (the cu111 wheels include sm_86)",
    "voice-cloning-app/Voice-Cloning-App#60", "version", "python",
    [f"{SITE}/torch/cuda/__init__.py:104: UserWarning: NVIDIA RTX A6000 with CUDA capability sm_86 is not "
     "compatible with the current PyTorch installation. The current PyTorch install supports CUDA capabilities "
     "sm_37 sm_50 sm_60 sm_61 sm_70 sm_75 compute_37.",
     "  warnings.warn(incompatible_device_warn.format(device_name, capability, \" \".join(arch_list), device_name))",
     "Loading checkpoint...",
     "RuntimeError: CUDA error: no kernel image is available for execution on the device"])

add("nccl-undefined-symbol-import", "nccl-library-mismatch",
    "make torch load the NCCL it was built with: uninstall the extra nvidia-nccl package or drop the "
    "system libnccl from LD_LIBRARY_PATH (pip install --force-reinstall torch)",
    "pytorch/pytorch#119932", "version", "torchrun",
    torchrun({r: tb([U(3, "<module>", "import torch"),
                     ("torch/__init__.py", 237, "<module>", "from torch._C import *  # noqa: F403")],
                    f"ImportError: {CONDA}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister", site=CONDA)
              for r in (0, 1)}, 0, 1, fmt="mid", site=CONDA, python="/home/test/anaconda3/envs/myenv/bin/python"))

add("nccl-undefined-symbol-pip-nccl", "nccl-library-mismatch",
    "install the nvidia-nccl-cu12 version that matches torch 2.2 (pip install nvidia-nccl-cu12==2.19.3) or "
    "reinstall torch so pip picks its own",
    "vllm-project/vllm#4195", "version", "python",
    ["$ pip list | grep -i -e torch -e nccl", "nvidia-nccl-cu12          2.18.1", "torch                     2.2.1",
     "$ python -m vllm.entrypoints.openai.api_server --model /models/qwen --tensor-parallel-size 2"]
    + tb([("/usr/lib/python3.10/runpy.py", 196, "_run_module_as_main", ""),
          ("vllm/entrypoints/openai/api_server.py", 11, "<module>", "import torch"),
          ("torch/__init__.py", 237, "<module>", "from torch._C import *  # noqa: F403")],
         f"ImportError: {SITE}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister"))

add("nccl-undefined-symbol-cu12-cu13", "nccl-library-mismatch",
    "keep one NCCL wheel: uninstall nvidia-nccl-cu12 when torch uses nvidia-nccl-cu13",
    "pytorch/pytorch#186591", "version", "torchrun",
    ["$ pip list | grep nccl", "nvidia-nccl-cu12   2.29.3", "nvidia-nccl-cu13   2.29.7"]
    + torchrun({r: tb([U(1, "<module>", "import torch", "bench.py"),
                       ("torch/__init__.py", 415, "<module>", "from torch._C import *  # noqa: F403")],
                      f"ImportError: {SITE}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommResume")
                for r in (0, 1, 2, 3)}, 0, 1, script="bench.py", others=((1, 1), (2, 1), (3, 1))))

add("nccl-undefined-symbol-ld-path", "nccl-library-mismatch",
    "stop LD_LIBRARY_PATH from putting an older system libnccl.so.2 in front of the one pip installed with torch",
    "NVIDIA/nccl#1180", "version", "deepspeed",
    ["$ echo $LD_LIBRARY_PATH", "/usr/local/nccl-2.18.3/lib:/usr/local/cuda/lib64"]
    + deepspeed({0: tb([U(2, "<module>", "import torch", "finetune.py")],
                       f"ImportError: {SITE}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister"),
                 1: tb([U(2, "<module>", "import torch", "finetune.py")],
                       f"ImportError: {SITE}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister")},
                1, ["finetune.py", "--deepspeed", "ds_config.json"]))

add("nccl-undefined-symbol-mixed-cuda", "nccl-library-mismatch",
    "remove the cu11 NVIDIA packages so only the CUDA 12 NCCL that torch expects is installed",
    "VichyTong/CodeJudge#2", "version", "python",
    ["$ python run_judge.py --model gpt-3.5", "Traceback (most recent call last):",
     '  File "/home/user/CodeJudge/run_judge.py", line 4, in <module>', "    import torch",
     f'  File "{CONDA}/torch/__init__.py", line 235, in <module>', "    from torch._C import *  # noqa: F403",
     f"ImportError: {CONDA}/torch/lib/libtorch_cuda.so: undefined symbol: ncclCommRegister",
     "$ pip list | grep nvidia", "nvidia-nccl-cu11          2.14.3", "nvidia-nccl-cu12          2.19.3"])

LR_USAGE = ("usage: main.py [-h] [--local_rank LOCAL_RANK] [--cfg CFG] [--batch_size BATCH_SIZE]\n"
            "main.py: error: unrecognized arguments: --local-rank={r}")

add("local-rank-tecogan", "launcher-local-rank-arg",
    "accept both spellings: parser.add_argument('--local-rank', '--local_rank', type=int) or read "
    "os.environ['LOCAL_RANK'] (torch.distributed.launch of PyTorch 2 passes --local-rank)",
    "skycrapers/TecoGAN-PyTorch#31", "version", "launch",
    torchrun({r: LR_USAGE.format(r=r).splitlines() for r in (0, 1)}, 0, 2, fmt="old", launcher="launch",
             script="main.py", python="/home/rong/anaconda3/envs/tecogan/bin/python"))

add("local-rank-babylm-colab", "launcher-local-rank-arg",
    "use torchrun and read LOCAL_RANK from the environment, or add '--local-rank' to the parser",
    "babylm/baseline-pretraining#2", "version", "launch",
    torchrun({0: ["usage: general_train.py", "       [-h]", "       [--setting SETTING]",
                  "       [--local_rank LOCAL_RANK]", "       [--train_upto_epoch TRAIN_UPTO_EPOCH]",
                  "general_train.py: error: unrecognized arguments: --local-rank=0"]},
             0, 2, fmt="old", launcher="launch", script="baseline-pretraining/scripts/general_train.py"))

add("local-rank-monai", "launcher-local-rank-arg",
    "parse '--local-rank' (PyTorch 2 spelling) or switch to torchrun and LOCAL_RANK",
    "Project-MONAI/tutorials#1665", "version", "launch",
    torchrun({0: ["usage: brats_training_ddp.py [-h] [-d DIR] [--local_rank LOCAL_RANK]",
                  "                             [--epochs N] [--lr LR] [-b BATCH_SIZE]",
                  "brats_training_ddp.py: error: unrecognized arguments: --local-rank=0"]},
             0, 2, fmt="mid", launcher="launch", script="brats_training_ddp.py", python="/usr/bin/python"))

add("local-rank-legacy-no-arg", "launcher-local-rank-arg",
    "the launcher passes --local_rank to every process: add the argument to the script's parser "
    "(or use torchrun, which passes LOCAL_RANK in the environment)",
    "FudanNLP/CPT#65", "version", "launch",
    launch_legacy({r: ["usage: train_adgen.py [-h] [--model_path MODEL_PATH] [--dataset DATASET]",
                       "                      [--lr LR] [--batch_size BATCH_SIZE] [--epoch EPOCH]",
                       f"train_adgen.py: error: unrecognized arguments: --local_rank={r}"] for r in (0, 1, 2)},
                  2, 2, ["train_adgen.py"], python="/home/user/miniconda/bin/python"))

add("local-rank-timm-8gpu", "launcher-local-rank-arg",
    "update the script to accept --local-rank (timm fixed its parser) or launch with torchrun",
    "huggingface/pytorch-image-models#1724", "version", "launch",
    torchrun({r: ["usage: train.py [-h] [--data-dir DIR] [--dataset NAME] [--train-split NAME] [--val-split NAME]",
                  f"train.py: error: unrecognized arguments: --local-rank={r}"] for r in (0, 1, 2, 3)},
             0, 2, fmt="old", launcher="launch", others=((1, 2), (2, 2), (3, 2))))

add("local-rank-xmem-no-arg", "launcher-local-rank-arg",
    "launch with torchrun (torch.distributed.run), which does not append --local_rank, or parse it",
    "hkchengrex/XMem#18", "version", "launch",
    torchrun({0: ["usage: train.py [-h] [--benchmark] [--stage STAGE] [--exp_id EXP_ID]",
                  "train.py: error: unrecognized arguments: --local_rank=0"]},
             0, 2, fmt="old", launcher="launch"))

WIN_PRE = ["NOTE: Redirects are currently not supported in Windows or MacOs."]

add("windows-no-nccl-llama3", "nccl-not-built",
    "Windows builds of PyTorch have no NCCL: use backend='gloo' (or run under WSL2/Linux)",
    "meta-llama/llama3#127", "version", "torchrun",
    ["[2024-04-23 13:27:20,383] torch.distributed.elastic.multiprocessing.redirects: [WARNING] NOTE: Redirects "
     "are currently not supported in Windows or MacOs.",
     "[W socket.cpp:697] [c10d] The client socket has failed to connect to [activate.navicat.com]:29500 (system "
     "error: 10049 - The requested address is not valid in its context.).",
     "[W socket.cpp:697] [c10d] The client socket has failed to connect to [activate.navicat.com]:29500 (system "
     "error: 10049 - The requested address is not valid in its context.)."]
    + torchrun({0: tb([("E:\\ai\\models\\llama\\llama3\\example_chat_completion.py", 84, "<module>", "fire.Fire(main)"),
                       ("E:\\ai\\models\\llama\\llama3\\llama\\generation.py", 68, "build",
                        "torch.distributed.init_process_group(\"nccl\")"),
                       ("D:\\Caches\\Conda\\conda_envs\\llama3\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py",
                        1586, "_new_process_group_helper", "raise RuntimeError(\"Distributed package doesn't have NCCL built in\")")],
                      "RuntimeError: Distributed package doesn't have NCCL built in")},
               0, 1, fmt="mid", prefix=False, script="example_chat_completion.py",
               python="D:\\Caches\\Conda\\conda_envs\\llama3\\python.exe", host="DESKTOP-L3"))

add("windows-no-nccl-pyskl", "nccl-not-built",
    "on Windows use the gloo backend (dist_params = dict(backend='gloo')) or train on Linux",
    "kennymckormick/pyskl#79", "version", "launch",
    WIN_PRE + ["[W C:\\actions-runner\\_work\\pytorch\\pytorch\\builder\\windows\\pytorch\\torch\\csrc\\distributed\\c10d\\socket.cpp:558] "
               "[c10d] The client socket has failed to connect to [DESKTOP-7BNNAUJ]:29995 (system error: 10049 - The "
               "requested address is not valid in its context.)."]
    + torchrun({0: tb([("C:\\Users\\usuario\\pyskl\\tools\\test.py", 153, "main", "init_dist(args.launcher, **cfg.dist_params)"),
                       ("C:\\Users\\usuario\\AppData\\Local\\Programs\\Python\\Python39\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py",
                        602, "init_process_group", "default_pg = _new_process_group_helper(")],
                      "RuntimeError: Distributed package doesn't have NCCL built in")},
               0, 1, fmt="old", launcher="launch", script="tools/test.py",
               python="C:\\Users\\usuario\\AppData\\Local\\Programs\\Python\\Python39\\python.exe"))

add("windows-no-nccl-lightning", "nccl-not-built",
    "on Windows choose a gloo-backed strategy (e.g. DDPStrategy(process_group_backend='gloo')) or one GPU",
    "XavierXiao/Dreambooth-Stable-Diffusion#65", "version", "lightning",
    lightning_banner(1, old=True)[:3]
    + tb([("main.py", 830, "<module>", "trainer.fit(model, data)"),
          ("C:\\Users\\frank\\anaconda3\\envs\\dreambooth\\lib\\site-packages\\pytorch_lightning\\trainer\\trainer.py",
           1137, "_run", "self.accelerator.setup_environment()"),
          ("C:\\Users\\frank\\anaconda3\\envs\\dreambooth\\lib\\site-packages\\pytorch_lightning\\strategies\\ddp.py",
           187, "setup_distributed", "init_dist_connection(self.cluster_environment, self._process_group_backend)"),
          ("C:\\Users\\frank\\anaconda3\\envs\\dreambooth\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py",
           602, "init_process_group", "default_pg = _new_process_group_helper(")],
         "RuntimeError: Distributed package doesn't have NCCL built in"))

add("windows-no-nccl-single-gpu", "nccl-not-built",
    "Windows has no NCCL: set the distributed backend to gloo (or train on Linux)",
    "OFA-Sys/Chinese-CLIP#279", "version", "torchrun",
    torchrun({0: tb([("D:\\Chinese-CLIP\\cn_clip\\training\\main.py", 61, "main",
                      "dist.init_process_group(backend=\"nccl\")"),
                     ("C:\\anaconda\\envs\\clip\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py", 907,
                      "init_process_group", "default_pg = _new_process_group_helper(")],
                    "RuntimeError: Distributed package doesn't have NCCL built in")},
             0, 1, fmt="old", prefix=False, script="cn_clip/training/main.py", python="C:\\anaconda\\envs\\clip\\python.exe"))

LIBUV = [("torch/distributed/elastic/agent/server/api.py", 500, "_rendezvous",
          "rdzv_info = spec.rdzv_handler.next_rendezvous()"),
         ("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", 67, "next_rendezvous",
          "self._store = TCPStore(  # type: ignore[call-arg]")]

add("windows-libuv-llamafactory", "tcpstore-no-libuv",
    "Windows wheels of PyTorch 2.4+ have no libuv: set USE_LIBUV=0 before torchrun (or init with "
    "tcp://...?use_libuv=0)",
    "hiyouga/LlamaFactory#7124", "version", "torchrun",
    tb([("F:\\CondaData\\envs\\llama_factory\\Scripts\\torchrun.exe\\__main__.py", 7, "<module>", ""),
        ("F:\\CondaData\\envs\\llama_factory\\lib\\site-packages\\torch\\distributed\\run.py", 919, "main", "run(args)"),
        ("F:\\CondaData\\envs\\llama_factory\\lib\\site-packages\\torch\\distributed\\launcher\\api.py", 260,
         "launch_agent", "result = agent.run()"),
        ("F:\\CondaData\\envs\\llama_factory\\lib\\site-packages\\torch\\distributed\\elastic\\agent\\server\\api.py",
         500, "_rendezvous", "rdzv_info = spec.rdzv_handler.next_rendezvous()"),
        ("F:\\CondaData\\envs\\llama_factory\\lib\\site-packages\\torch\\distributed\\elastic\\rendezvous\\static_tcp_rendezvous.py",
         67, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
       "RuntimeError: use_libuv was requested but PyTorch was build without libuv support"))

add("windows-libuv-fluxgym", "tcpstore-no-libuv",
    "set the environment variable USE_LIBUV=0 for the launcher on Windows",
    "cocktailpeanut/fluxgym#302", "version", "accelerate",
    ["[INFO] Running accelerate launch --mixed_precision bf16 --num_cpu_threads_per_process 1 sd-scripts/flux_train_network.py"]
    + tb([("C:\\Users\\pc\\AppData\\Local\\Programs\\Python\\Python311\\Lib\\site-packages\\accelerate\\commands\\launch.py",
           1097, "launch_command", "multi_gpu_launcher(args)"),
          ("C:\\Users\\pc\\AppData\\Local\\Programs\\Python\\Python311\\Lib\\site-packages\\torch\\distributed\\elastic\\agent\\server\\api.py",
           500, "_rendezvous", "rdzv_info = spec.rdzv_handler.next_rendezvous()"),
          ("C:\\Users\\pc\\AppData\\Local\\Programs\\Python\\Python311\\Lib\\site-packages\\torch\\distributed\\elastic\\rendezvous\\static_tcp_rendezvous.py",
           67, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
         "RuntimeError: use_libuv was requested but PyTorch was build without libuv support")
    + ["[ERROR] Command exited with code 1"])

add("windows-libuv-edtalk", "tcpstore-no-libuv",
    "use a PyTorch release whose Windows TCPStore works without libuv (2.3.x), or USE_LIBUV=0",
    "tanshuai0219/EDTalk#24", "version", "python",
    ["(edtalk) D:\\EDTalk> python train_fine_tune.py --datapath ./inputs/train/video_crop/Obama/ --only_fine_tune_dec"]
    + tb([("D:\\EDTalk\\train_fine_tune.py", 188, "<module>", "dist.init_process_group(backend='gloo', init_method='env://', rank=0, world_size=1)"),
          ("D:\\conda\\envs\\edtalk\\lib\\site-packages\\torch\\distributed\\rendezvous.py", 189, "_create_c10d_store",
           "return TCPStore(")],
         "RuntimeError: use_libuv was requested but PyTorch was build without libuv support"))

add("torch-too-old-mmdet", "torch-api-mismatch",
    "install the PyTorch version the project requires (0.4.1 here; torch.distributed._initialized is newer)",
    "open-mmlab/mmdetection#132", "version", "launch",
    launch_legacy({0: tb([("tools/train.py", 90, "main", "init_dist(args.launcher, **cfg.dist_params)"),
                          ("/home/user/mmdetection/mmdet/apis/env.py", 31, "_init_dist_pytorch",
                           "dist.init_process_group(backend=backend, **kwargs)"),
                          ("torch/distributed/__init__.py", 95, "init_process_group", "if torch.distributed._initialized:")],
                         "AttributeError: module 'torch.distributed' has no attribute '_initialized'", site=SITE)},
                  0, 1, ["tools/train.py", "configs/faster_rcnn_r50_fpn_1x.py", "--launcher", "pytorch"]))

add("torch-too-old-device-mesh", "torch-api-mismatch",
    "upgrade PyTorch (torch.distributed.device_mesh needs 2.2+; the project pins torch==2.6.0)",
    "QwenLM/Qwen2.5-Omni#87", "version", "python",
    ["$ python -c 'import torch; print(torch.__version__)'", "2.1.2+cu121"]
    + tb([("/home/user/Qwen2.5-Omni/web_demo.py", 9, "<module>", "from transformers import Qwen2_5OmniModel"),
          ("transformers/integrations/tensor_parallel.py", 33, "<module>", "from torch.distributed.device_mesh import DeviceMesh")],
         "AttributeError: module 'torch.distributed' has no attribute 'device_mesh'"))

add("torch-too-old-dist-tensor", "torch-api-mismatch",
    "upgrade to PyTorch >= 2.1 (torch.distributed._tensor does not exist in 1.12)",
    "zyushun/Adam-mini#33", "version", "torchrun",
    torchrun({r: tb([U(12, "<module>", "from adam_mini import Adam_mini"),
                     ("adam_mini/adam_mini.py", 7, "<module>", "from torch.distributed._tensor import Replicate")],
                    "ModuleNotFoundError: No module named 'torch.distributed._tensor'") for r in (0, 1)},
             0, 1, fmt="old", others=((1, 1),)))

add("torch-too-old-all-gather-base", "torch-api-mismatch",
    "torch 1.7.1 has no dist._all_gather_base: upgrade PyTorch or install an apex built for this torch",
    "NVIDIA/apex#1671", "version", "launch",
    launch_legacy({0: tb([U(5, "<module>", "from apex.transformer import parallel_state"),
                          ("apex/transformer/tensor_parallel/mappings.py", 24, "<module>",
                           "_all_gather_func = torch.distributed._all_gather_base")],
                         "AttributeError: module 'torch.distributed' has no attribute '_all_gather_base'")},
                  0, 1, ["train.py"]))

add("torch-api-removed-num-iterations", "torch-api-mismatch",
    "the code copied DDP internals that PyTorch 2.1 removed (num_iterations): update the code or pin torch 2.0.1",
    "rwth-i6/returnn#1451", "version", "torchrun",
    torchrun({0: tb([("/home/user/returnn/returnn/torch/engine.py", 372, "train_epoch", "self._run_step(extern_data)"),
                     ("/home/user/returnn/returnn/torch/distributed.py", 135, "ddp_train_forward_ctx",
                      "ddp_model.num_iterations += 1"),
                     ("torch/nn/modules/module.py", 1695, "__getattr__",
                      "raise AttributeError(f\"'{type(self).__name__}' object has no attribute '{name}'\")")],
                    "AttributeError: 'DistributedDataParallel' object has no attribute 'num_iterations'")},
             0, 1, fmt="mid", script="rnn.py"))

# --------------------------------------------------------------------------------------------
# Network addressing
# --------------------------------------------------------------------------------------------

def connect_warns(addr, port, errno="110 - Connection timed out", n=3, ts="W0513 10:41:07.112000000", v6=True):
    out = []
    for i in range(n):
        if v6:
            out.append(f"[{ts} socket.cpp:663] [c10d] The client socket has failed to connect to [::ffff:{addr}]:{port} (errno: {errno}).")
        out.append(f"[{ts} socket.cpp:663] [c10d] The client socket has failed to connect to {addr}:{port} (errno: {errno}).")
    return out


add("master-addr-wrong-ip", "rendezvous-unreachable",
    "set MASTER_ADDR to an address of the master node that this node can reach (here the script exported "
    "the wrong IP) and keep MASTER_PORT open",
    "hiyouga/LlamaFactory#3715", "network", "torchrun",
    ["+ CUDA_VISIBLE_DEVICES=0,1,2,3 python -m torch.distributed.run --nproc_per_node 4 --nnodes 1 --node_rank 0 "
     "--master_addr 192.168.0.1 --master_port 29500 src/train.py examples/full_multi_gpu/llama3_full_sft.yaml"]
    + connect_warns("192.168.0.1", 29500, n=4, ts="W513 10:02:11.301427120")
    + ["[E513 10:12:11.512220345 socket.cpp:957] [c10d] The client socket has timed out after 600s while trying "
       "to connect to (192.168.0.1, 29500)."]
    + torchrun({0: tb([U(14, "<module>", "main()", "src/train.py"), ("torch/distributed/distributed_c10d.py", 1305,
                       "init_process_group", "store, rank, world_size = next(rendezvous_iterator)")] + ENV_RDZV,
                      "torch.distributed.DistNetworkError: The client socket has timed out after 600s while trying "
                      "to connect to (192.168.0.1, 29500).")}, 0, 1, fmt="mid", script="src/train.py",
               others=((1, 1), (2, 1), (3, 1))))

add("master-host-unresolved-old", "master-host-unresolved",
    "MASTER_ADDR is a hostname this node cannot resolve: use the master's IP address or fix DNS//etc/hosts "
    "(the job was submitted to the wrong machine)",
    "pytorch/examples#540", "network", "mpirun",
    ["$ mpirun -np 2 python main.py --dist-url env:// --dist-backend nccl /data/imagenet",
     "=> creating model 'resnet50'"]
    + tb([("main.py", 113, "main_worker", "world_size=args.world_size, rank=args.rank)"),
          ("/apps/pytorch/1.1.0a0-py36/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 354,
           "init_process_group", "store, rank, world_size = next(rendezvous(url))"),
          ("/apps/pytorch/1.1.0a0-py36/lib/python3.6/site-packages/torch/distributed/rendezvous.py", 143,
           "_env_rendezvous_handler", "store = TCPStore(master_addr, master_port, world_size, start_daemon)")],
         "ValueError: host not found: Name or service not known"))

GAI = ("[W1008 23:40:22.781961348 socket.cpp:767] [c10d] The IPv6 network addresses of ({h}, {p}) cannot be "
       "retrieved (gai error: -2 - Name or service not known).")

add("master-host-unresolved-gcp", "master-host-unresolved",
    "the master's hostname does not resolve in this network: pass its IP address as MASTER_ADDR",
    "meta-pytorch/monarch#1571", "network", "torchrun",
    [GAI.format(h="job-01k72wn5f8waqw7d81mfggagn4.internal", p=50745)] * 3
    + ["[W1008 23:40:22.836678340 socket.cpp:767] [c10d] The client socket has failed to connect to "
       "[job-01k72wn5f8waqw7d81mfggagn4.internal]:50745 (errno: 22 - Invalid argument)."] * 2
    + torchrun({1: tb(INIT + ENV_RDZV, "torch.distributed.DistNetworkError: The client socket has timed out after "
                      "1800000ms while trying to connect to (job-01k72wn5f8waqw7d81mfggagn4.internal, 50745).")},
               1, 1, script="trainer.py", host="job-01k72wn5f8waqw7d81mfggagn4-w1"))

add("master-host-unresolved-colossalai", "master-host-unresolved",
    "use --master_addr localhost (or --standalone) on one machine: the instance hostname i-7840df31 does not resolve",
    "hpcaitech/ColossalAI#2841", "network", "torchrun",
    [GAI.format(h="i-7840df31", p=37340).replace("W1008 23:40:22.781961348 socket.cpp:767", "W socket.cpp:601")] * 6
    + ["[E socket.cpp:793] [c10d] The client socket has timed out after 1800s while trying to connect to (i-7840df31, 37340)."]
    + torchrun({0: tb([U(176, "<module>", "main(args)", "train_prompts.py")] + INIT_OLD,
                      "TimeoutError: The client socket has timed out after 1800s while trying to connect to (i-7840df31, 37340).")},
               0, 1, fmt="old", script="train_prompts.py"))

add("master-host-not-yet-resolvable", "master-host-unresolved",
    "the master pod's DNS name does not resolve until that pod is ready: the warnings stop once it starts; "
    "only act if they continue past the rendezvous timeout",
    "kubernetes-sigs/jobset#93", "network", "torchrun",
    ["[W socket.cpp:558] [c10d] The IPv6 network addresses of (pytorch-workers-0-0.pytorch-workers, 3389) cannot "
     "be retrieved (gai error: -2 - Name or service not known)."] * 8
    + ["[rank1]: Epoch 0 | step 0 | loss 2.3026", "[rank1]: Epoch 0 | step 100 | loss 0.4127"])

add("rendezvous-new-wording-sglang", "rendezvous-unreachable",
    "start the rank-0 node first and give every node the same --dist-init-addr that it can reach "
    "(host:port of node 0, port open)",
    "sgl-project/sglang#2561", "network", "slurm",
    slurm([(1, "[E1226 15:44:25.497183572 socket.cpp:1011] [c10d] The client socket has timed out after 600000ms "
               "while trying to connect to (sws-8h100grid-05, 8000)."),
           (1, "[W1226 15:44:25.497497753 TCPStore.cpp:358] [c10d] TCP client failed to connect/validate to host "
               "sws-8h100grid-05:8000 - retrying (try=0, timeout=600000ms, delay=82879ms): The client socket has "
               "timed out after 600000ms while trying to connect to (sws-8h100grid-05, 8000)."),
           (1, "Exception raised from throwTimeoutError at ../torch/csrc/distributed/c10d/socket.cpp:1013 (most recent call first):"),
           (1, "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
               "connect to (sws-8h100grid-05, 8000).")], label=True, fails=((1, 1),), node="sws-8h100grid-06"))

add("rendezvous-connect-timeout-old", "rendezvous-unreachable",
    "the port on the master was not reachable from the node (closed/firewalled or wrong MASTER_ADDR): open "
    "MASTER_PORT between the nodes or pick an open port",
    "huggingface/transformers#1795", "network", "launch",
    launch_legacy({0: tb([("examples/distillation/train.py", 258, "main", "init_gpu_params(args)"),
                          ("examples/distillation/utils.py", 114, "init_gpu_params",
                           "torch.distributed.init_process_group(init_method=\"env://\", backend=\"nccl\")"),
                          ("/opt/conda/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 400,
                           "init_process_group", "store, rank, world_size = next(rendezvous(url))"),
                          ("/opt/conda/lib/python3.6/site-packages/torch/distributed/rendezvous.py", 143,
                           "_env_rendezvous_handler", "store = TCPStore(master_addr, master_port, world_size, start_daemon)")],
                         "RuntimeError: Connection timed out")}, 0, 1, ["train.py", "--force"]))

add("rendezvous-c10d-endpoint-fairseq", "rendezvous-unreachable",
    "node 1 could not reach --master_addr 192.168.010.100:22015: write the address without leading zeros "
    "and open the port between the nodes",
    "facebookresearch/fairseq#604", "network", "launch",
    ["| distributed init (rank 4): tcp://192.168.010.100:22015"]
    + launch_legacy({0: tb([("/home/tuan/pytorch/fairseq/fairseq/distributed_utils.py", 80, "distributed_init",
                             "world_size=args.distributed_world_size, rank=args.distributed_rank)"),
                            ("/home/tuan/anaconda3/lib/python3.7/site-packages/torch/distributed/distributed_c10d.py",
                             354, "init_process_group", "store, rank, world_size = next(rendezvous(url))"),
                            ("/home/tuan/anaconda3/lib/python3.7/site-packages/torch/distributed/rendezvous.py", 95,
                             "_tcp_rendezvous_handler", "store = TCPStore(result.hostname, result.port, world_size, start_daemon)")],
                           "RuntimeError: connect() timed out.")}, 0, 1, ["fairseq-train", "data-bin/wikitext-103"]))

add("gloo-loopback-hosts-ray", "gloo-connect-full-mesh",
    "the hostname resolves to 127.0.1.1 in /etc/hosts: map it to the LAN address (or set GLOO_SOCKET_IFNAME)",
    "ray-project/ray#37461", "network", "ray",
    ["(RayTrainWorker pid=4137, ip=192.168.1.21) Setting up process group for: env:// [rank=1, world_size=2]",
     "(RayTrainWorker pid=4137, ip=192.168.1.21) [E socket.cpp] RuntimeError: Gloo connectFullMesh failed with "
     "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"]
    + tb([("ray/train/torch/config.py", 199, "_setup_torch_process_group", "dist.init_process_group("),
          ("torch/distributed/distributed_c10d.py", 932, "init_process_group", "default_pg = _new_process_group_helper("),
          ("torch/distributed/distributed_c10d.py", 1097, "_new_process_group_helper", "backend_class = ProcessGroupGloo(")],
         "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] "
         "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.1.1]:41287"))

add("gloo-loopback-hostnetwork", "gloo-connect-full-mesh",
    "Gloo fell back to 127.0.0.1 because the pod hostname has no routable address: set GLOO_SOCKET_IFNAME "
    "to the node's primary interface",
    "aws-samples/aws-do-eks#50", "network", "ray",
    ["[rank8] Warning: Unable to resolve hostname to a (local) address. Using the loopback address as fallback. "
     "Manually set the network interface with GLOO_SOCKET_IFNAME",
     "[rank8]: RuntimeError: Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] "
     "timed out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:14215 (rank=8, size=16, local=[127.0.0.1])",
     "EngineCore failed to start."])

GLOO_IFACE = [("torch/distributed/distributed_c10d.py", 1903, "_new_process_group_helper",
               "backend_class = ProcessGroupGloo(")]

add("gloo-ifname-missing-dgx-spark", "socket-ifname-missing",
    "GLOO_SOCKET_IFNAME=eth0 names an interface this host does not have (it has enP7s7): set it to an "
    "existing interface or leave it unset",
    "spark-arena/sparkrun#275", "network", "python",
    ["(EngineCore pid=311) INFO GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0"]
    + tb([("vllm/distributed/parallel_state.py", 1042, "init_distributed_environment", "torch.distributed.init_process_group(")]
         + INIT + GLOO_IFACE,
         "RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] ifa != nullptr. "
         "Unable to find address for: eth0"))

add("gloo-ifname-exclusion-list", "socket-ifname-missing",
    "GLOO_SOCKET_IFNAME takes one concrete interface name, not NCCL's ^exclusion list: export the real "
    "interface (e.g. ens5)",
    "aws-samples/aws-do-eks#51", "network", "python",
    ["[rank0]: RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
     "ifa != nullptr. Unable to find address for: ^lo",
     "EngineCore failed to start."])

add("gloo-hostname-unresolvable-docker", "gloo-connect-full-mesh",
    "gloo could not find an address for the container hostname: pick the interface with GLOO_SOCKET_IFNAME "
    "(ifconfig shows which)",
    "msr-fiddle/pipedream#32", "network", "python",
    tb([("main_with_runtime.py", 192, "main", "enable_recompute=args.recompute)"),
        ("../communication.py", 42, "__init__", "dist.init_process_group(backend, rank=rank, world_size=world_size)"),
        ("/opt/conda/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 370, "init_process_group",
         "timeout=timeout)")],
       "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:127] rp != nullptr. "
       "Unable to find address for: dgx-1.ai"),
    alt=("socket-ifname-missing",))

add("nccl-ifname-missing-new", "socket-ifname-missing",
    "NCCL_SOCKET_IFNAME=eth2 names an interface this host does not have: set it to an existing one",
    "NVIDIA/nccl#1837", "network", "torchrun",
    torchrun({3: nccl_info("twshared1016", 1958, 3, ["NCCL_SOCKET_IFNAME set by environment to eth2",
                                                      "NCCL_SOCKET_IFNAME set to eth2"]),
              0: tb([U(88, "main", "dist.barrier()")], nccl_exc("internal", "ncclSocketInit: connecting to address  with "
                    "family 59936 is neither AF_INET(2) nor AF_INET6(10)", ver="2.27.7"))},
             0, 1, others=((3, -15),)))

add("nccl-ifname-missing-per-node", "socket-ifname-missing",
    "the nodes name their interfaces differently (enp4s0 / enp6s0): give NCCL_SOCKET_IFNAME both names "
    "(NCCL_SOCKET_IFNAME=enp4s0,enp6s0) or set it per node",
    "NVIDIA/nccl-tests#219", "network", "mpirun",
    ["# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
     "gpu-b:5123:5123 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to enp4s0",
     "",
     "gpu-b:5123:5123 [0] bootstrap.cc:47 NCCL WARN Bootstrap : no socket interface found",
     "gpu-b:5123:5123 [0] NCCL INFO init.cc:87 -> 3",
     "gpu-b: Test NCCL failure common.cu:959 'internal error - please report this issue to the NCCL developers / '",
     " .. gpu-b pid 5123: Test failure common.cu:843"])

add("nccl-lo-between-nodes", "nccl-wrong-interface",
    "NCCL_SOCKET_IFNAME=lo is loopback and cannot reach the other node: name the real NICs "
    "(NCCL_SOCKET_IFNAME=eno1,eth0) or leave it unset",
    "NVIDIA/nccl#286", "network", "launch",
    launch_legacy({0: ["node1:12345:12345 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo",
                       "node1:12345:12345 [0] NCCL INFO Bootstrap : Using [0]lo:127.0.0.1<0>",
                       "node1:12345:12345 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>"]
                   + tb([U(77, "main", "model = DDP(model, device_ids=[args.local_rank])"),
                         ("torch/nn/parallel/distributed.py", 298, "__init__", "self.broadcast_bucket_size)")],
                        "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, unhandled "
                        "system error, NCCL version 2.4.8")}, 0, 1, ["train.py"]))

add("nccl-many-bridges", "nccl-wrong-interface",
    "NCCL is trying every docker bridge and veth interface: set NCCL_SOCKET_IFNAME=bond0 (the interface "
    "the nodes share)",
    "NVIDIA/nccl#697", "network", "torchrun",
    torchrun({0: nccl_info("node161", 20311, 0, [
        "Bootstrap : Using bond0:192.168.1.161<0>",
        "NET/Socket : Using [0]bond0:192.168.1.161<0> [1]br-05ab815fa14e:172.19.0.1<0> [2]br-d5d80d7dbbad:172.21.0.1<0> "
        "[3]br-dd40dc616638:172.30.0.1<0> [4]br-e3fd6ba7b530:192.168.16.1<0> [5]veth6163fba:fe80::b878:6cff:fe52:abe2%veth6163fba<0>",
        "Using network Socket",
        "!NET/Socket : Connect to 172.19.0.1<49387> failed : Connection refused"])
        + tb([U(61, "main", "model = DDP(model, device_ids=[local_rank])")] + DDP_INIT,
             nccl_exc("system", "socketStartConnect: Connect to 172.19.0.1<49387> failed : Connection refused",
                      ver="2.10.3", where="../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191"))},
        0, 1, fmt="old"))

add("nccl-ib-gid-index", "nccl-ib-network",
    "RoCE with the wrong GID index: set NCCL_IB_GID_INDEX=3 (the RoCE v2 GID from show_gids)",
    "NVIDIA/nccl#426", "network", "mpirun",
    ["worker-0:946:946 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.1.12<0>",
     "worker-1:812:812 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.1.13<0>",
     "worker-1:812:851 [0] NCCL INFO Channel 00 : 1[3000] -> 0[3000] [send] via NET/IB/0",
     "",
     "worker-1:946:988 [0] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, vendor err 129",
     "worker-1:946:988 [0] NCCL INFO transport/net_ib.cc:838 -> 2",
     "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:784, unhandled system error, NCCL version 2.7.8"],
    alt=("nccl-remote-error",))

add("nccl-ib-cross-nic", "nccl-ib-network",
    "on a rail-connected fabric only same-index NICs reach each other: set NCCL_CROSS_NIC=0",
    "NVIDIA/nccl#2013", "network", "torchrun",
    torchrun({5: ["host-01:88211:88240 [5] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]mlx5_2:1/RoCE "
                  "[3]mlx5_3:1/RoCE [RO]; OOB bond0:10.1.2.11<0>",
                  "host-01:88211:88240 [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection "
                  "timed out, on dev mlx5_3:1, curr state INIT, next state RTR, local GID index 3, local GID "
                  "::ffff:10.1.13.11, remote GID ::ffff:10.1.40.27"]
              + tb([U(211, "save", "dcp.save(state_dict, checkpoint_id=path)", "checkpoint.py")],
                   nccl_exc("system", "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_3:1, "
                            "curr state INIT, next state RTR", ver="2.27.3"))},
             5, 1, script="checkpoint.py", host="host-01"),
    alt=("nccl-remote-error",))

add("nccl-ib-error12-timeout", "nccl-ib-network",
    "IB error 12 is a transport timeout: the NICs cannot talk over RoCE (routing/GID/traffic class) or the "
    "fabric drops packets; test with ib_write_bw, then NCCL_IB_GID_INDEX / NCCL_IB_TIMEOUT",
    "NVIDIA/nccl#902", "network", "torchrun",
    torchrun({2: ["kolyoz2:25146:25854 [0] ib_plugin.c:1105 NCCL WARN NET/IB : Got completion from peer "
                  "10.0.35.1<49189> with error 12, opcode 0, len 0, vendor err 129 (Recv)"]
              + tb([U(140, "train_step", "loss.backward()")] + BACKWARD,
                   nccl_exc("remote", "NET/IB : Got completion from peer 10.0.35.1<49189> with error 12, opcode 0, "
                            "len 0, vendor err 129 (Recv)", ver="2.18.5"))},
             2, 1, host="kolyoz2", others=((0, -15), (1, -15), (3, -15))),
    alt=("nccl-remote-error",))

add("nccl-remote-error-ib-nodes", "nccl-remote-error",
    "no rank crashed first here: the network failed (some nodes had InfiniBand problems); check the fabric "
    "(ibstat, ib_write_bw) and exclude the bad nodes",
    "NVIDIA/nccl#2076", "network", "torchrun",
    torchrun({1: tb([U(203, "train", "loss.backward()")] + BACKWARD,
                    nccl_exc("remote", "socketProgressOpt: Call to recv from 172.16.4.22<33759> failed : Connection reset by peer",
                             ver="2.21.5", where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268"))},
             1, 1, others=((0, -15), (2, -15), (3, -15))),
    alt=("nccl-ib-network",))

add("nccl-remote-error-peer-segfault", "nccl-remote-error",
    "a remote rank crashed first (segmentation fault); the NCCL error on the others is the consequence: fix "
    "the crashing rank",
    "NVIDIA/nccl#795", "network", "torchrun",
    ["a100-st-p4d24xlarge-22:183006:183220 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 10.200.84.247<58355> failed : Broken pipe",
     "a100-st-p4d24xlarge-22:183006:183220 [1] proxy.cc:1119 NCCL WARN [Proxy Service 9] Failed to execute operation Connect from rank 9, retcode 6",
     "a100-st-p4d24xlarge-22:183006:183181 [1] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer a100-st-p4d24xlarge-23<47861>"]
    + torchrun({1: tb([U(97, "main", "dist.all_reduce(t)")],
                      nccl_exc("internal", "Net : Connection closed by remote peer a100-st-p4d24xlarge-23<47861>",
                               ver="2.14.3", where="../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269"))},
               1, 1, fmt="old", host="a100-st-p4d24xlarge-22")
    + ["", "=== on a100-st-p4d24xlarge-23 ===",
       "Signal 11 (SIGSEGV) received by PID 201544"],
    alt=("killed-by-signal",))

# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------

ORDINAL_NEW = ("RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at "
               "some other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
               "CUDA_LAUNCH_BLOCKING=1.\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
SETDEV = [("torch/cuda/__init__.py", 399, "set_device", "torch._C._cuda_setDevice(device)")]

add("ordinal-runx-8-procs", "more-ranks-than-gpus",
    "the recipe starts 8 processes per node (--nproc_per_node=8) on a machine with fewer GPUs: set it to "
    "the number of GPUs",
    "NVIDIA/semantic-segmentation#68", "launch", "launch",
    ["python -m torch.distributed.launch --nproc_per_node=8 train.py --dataset cityscapes --eval val"]
    + launch_legacy({r: ["THCudaCheck FAIL file=/opt/conda/conda-bld/pytorch_1595629403081/work/torch/csrc/cuda/Module.cpp "
                         "line=59 error=101 : invalid device ordinal"]
                     + tb([U(282, "<module>", "torch.cuda.set_device(args.local_rank)")] + SETDEV,
                          "RuntimeError: cuda runtime error (101) : invalid device ordinal at "
                          "/opt/conda/conda-bld/pytorch_1595629403081/work/torch/csrc/cuda/Module.cpp:59")
                     for r in (4, 5)}, 4, 1, ["train.py", "--dataset", "cityscapes"]))

add("ordinal-hrnet-3gpus", "more-ranks-than-gpus",
    "--nproc_per_node must equal the number of GPUs (3 here, with CUDA_VISIBLE_DEVICES=0,1,2)",
    "HRNet/HRNet-Semantic-Segmentation#171", "launch", "launch",
    ["+ python -m torch.distributed.launch --nproc_per_node=4 tools/train.py --cfg experiments/cityscapes/seg_hrnet_w48.yaml"]
    + launch_legacy({3: ["THCudaCheck FAIL file=/pytorch/torch/csrc/cuda/Module.cpp line=33 error=10 : invalid device ordinal"]
                     + tb([U(98, "main", "torch.cuda.set_device(args.local_rank)", "tools/train.py"),
                           ("/home/qfy/.conda/envs/HRnets-torch1.1/lib/python3.6/site-packages/torch/cuda/__init__.py", 265,
                            "set_device", "torch._C._cuda_setDevice(device)")],
                          "RuntimeError: cuda runtime error (10) : invalid device ordinal at /pytorch/torch/csrc/cuda/Module.cpp:33")},
                    3, 1, ["tools/train.py", "--cfg", "experiments/cityscapes/seg_hrnet_w48.yaml"]))

add("ordinal-nanogpt-8-on-4", "more-ranks-than-gpus",
    "adapt --nproc_per_node=8 to the 4 GPUs this machine has",
    "KellerJordan/modded-nanogpt#61", "launch", "torchrun",
    ["+ torchrun --standalone --nproc_per_node=8 train_gpt.py"]
    + torchrun({r: tb([U(395, "<module>", "torch.cuda.set_device(device)", "train_gpt.py")] + SETDEV, ORDINAL_NEW.rstrip())
                for r in (4, 5, 6, 7)}, 4, 1, script="train_gpt.py", others=((0, -15), (1, -15), (2, -15), (3, -15))))

add("ordinal-watermarkdm-standalone", "more-ranks-than-gpus",
    "--nproc_per_node=8 assumes 8 GPUs: set it to the GPUs this machine has",
    "yunqing-me/WatermarkDM#8", "launch", "torchrun",
    ["$ torchrun --standalone --nproc_per_node=8 train.py --outdir=training-runs --data=datasets/cifar10-32x32.zip"]
    + torchrun({r: tb([U(224, "main", "torch.cuda.set_device(dist.get_local_rank())"),
                       U(17, "init", "torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', '0')))", "torch_utils/distributed.py")]
                      + SETDEV, ORDINAL_NEW.rstrip()) for r in (2, 3)},
               2, 1, fmt="mid", others=((3, 1), (0, -15), (1, -15))))

add("ordinal-colossalai-one-gpu", "more-ranks-than-gpus",
    "only one GPU is present: run with --nproc_per_node 1",
    "hpcaitech/ColossalAI#2439", "launch", "torchrun",
    ["+ torchrun --nproc_per_node 2 train_dreambooth_colossalai.py --pretrained_model_name_or_path=CompVis/stable-diffusion-v1-4"]
    + torchrun({1: tb([U(462, "main", "colossalai.launch_from_torch(config={})", "train_dreambooth_colossalai.py"),
                       ("colossalai/initialize.py", 95, "launch", "gpc.set_device(local_rank)"),
                       ("colossalai/context/parallel_context.py", 481, "set_device", "torch.cuda.set_device(device_ordinal)")]
                      + SETDEV, "RuntimeError: CUDA error: invalid device ordinal")},
               1, 1, fmt="old", script="train_dreambooth_colossalai.py", others=((0, -15),)))

add("ordinal-lane-detection-2-on-1", "more-ranks-than-gpus",
    "--nproc_per_node=2 on a one-GPU machine: use --nproc_per_node=1 (or run without the launcher)",
    "cfzd/Ultra-Fast-Lane-Detection#193", "launch", "launch",
    ["(lane-det) firdanis@firdanis-system:~/Ultra-Fast-Lane-Detection$ python -m torch.distributed.launch --nproc_per_node=2 train.py configs/culane.py"]
    + launch_legacy({1: tb([U(107, "<module>", "torch.cuda.set_device(args.local_rank)"),
                            ("/home/firdanis/anaconda3/envs/lane-det/lib/python3.7/site-packages/torch/cuda/__init__.py",
                             261, "set_device", "torch._C._cuda_setDevice(device)")],
                           "RuntimeError: CUDA error: invalid device ordinal")}, 1, 1, ["train.py", "configs/culane.py"]))

add("ordinal-pick-visible-2-nproc-4", "more-ranks-than-gpus",
    "CUDA_VISIBLE_DEVICES exposes 2 GPUs but --nproc_per_node=4: make them equal",
    "wenwenyu/PICK-pytorch#14", "launch", "launch",
    ["+ CUDA_VISIBLE_DEVICES=1,2 python -m torch.distributed.launch --nnode=1 --node_rank=0 --nproc_per_node=4 "
     "--master_addr=127.0.0.1 --master_port=5555 train.py -c config.json --local_world_size 2"]
    + launch_legacy({2: tb([U(70, "main", "torch.cuda.set_device(local_master_config['local_rank'])")] + SETDEV,
                           "RuntimeError: cuda runtime error (101) : invalid device ordinal at /pytorch/torch/csrc/cuda/Module.cpp:59")},
                    2, 1, ["train.py", "-c", "config.json"]))

DUP = "Duplicate GPU detected : rank {a} and rank {b} both on CUDA device {bus}"

add("duplicate-gpu-one-gpu-two-procs", "more-ranks-than-gpus",
    "the machine has one GPU but two processes were started: --nproc_per_node=1",
    "Intellindust-AI-Lab/DEIM#113", "launch", "torchrun",
    ["+ CUDA_VISIBLE_DEVICES=0 torchrun --master_port=7777 --nproc_per_node=2 train.py -c configs/deim_dfine/deim_hgnetv2_s_coco.yml"]
    + torchrun({1: tb([U(84, "main", "dist.barrier()", "engine/misc/dist_utils.py")],
                      nccl_exc("usage", DUP.format(a=1, b=0, bus=1000), ver="2.21.5",
                               where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317"))},
               1, 1, others=((0, -15),)),
    alt=("duplicate-gpu",))

add("duplicate-gpu-msn-devices", "duplicate-gpu",
    "the modified code placed every process on the same device: give each process its own GPU "
    "(torch.cuda.set_device(rank) / the --devices list)",
    "facebookresearch/msn#24", "launch", "mp.spawn",
    spawn(1, tb([("/home/user/msn/src/msn_train.py", 170, "main", "encoder = DistributedDataParallel(encoder)")] + DDP_INIT,
                nccl_exc("usage", DUP.format(a=0, b=1, bus=40), ver="2.14.3",
                         where="../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269")),
          script="main.py"))

add("duplicate-gpu-hardcoded-device", "duplicate-gpu",
    "a default GPU was hard-coded in train.py, so both ranks used it: remove it and let each rank use LOCAL_RANK",
    "Peterande/D-FINE#289", "launch", "torchrun",
    torchrun({0: tb([U(88, "main", "solver.fit()"), ("src/solver/det_solver.py", 23, "fit", "self.train()"),
                     ("src/misc/dist_utils.py", 61, "warp_model", "model = DDP(model, device_ids=[rank], output_device=rank)")]
                    + DDP_INIT, nccl_exc("usage", DUP.format(a=0, b=1, bus=2000), ver="2.19.3"))},
             0, 1, others=((1, -15),)))

add("no-launcher-rank-unset", "no-launcher-env",
    "the script was started with plain python (an IDE Run button): start it with torchrun / the given "
    "launch command so RANK, WORLD_SIZE, MASTER_ADDR are set",
    "bubbliiiing/yolov4-pytorch#313", "launch", "python",
    ["$ python train.py"]
    + tb([U(126, "<module>", "dist.init_process_group(backend=\"nccl\")")] + INIT
         + [("torch/distributed/rendezvous.py", 246, "_env_rendezvous_handler", "rank = int(_get_env_or_raise(\"RANK\"))"),
            ("torch/distributed/rendezvous.py", 231, "_get_env_or_raise", "raise _env_error(env_var)")],
         "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, but not set"))

add("no-launcher-keyerror-rank", "no-launcher-env",
    "use the distributed launcher (tools/dist_test.sh / python -m torch.distributed.launch) when --launcher "
    "pytorch is given, or --launcher none for one process",
    "open-mmlab/mmaction#181", "launch", "python",
    ["$ python tools/test_recognizer_heavy.py configs/ucf101/tsn_rgb_bninception.py work_dirs/latest.pth --launcher pytorch"]
    + tb([("tools/test_recognizer_heavy.py", 170, "main", "init_dist(args.launcher, **cfg.dist_params)"),
          ("/media/liuxy/dataset/mmaction/mmaction/apis/env.py", 16, "init_dist", "_init_dist_pytorch(backend, **kwargs)"),
          ("/media/liuxy/dataset/mmaction/mmaction/apis/env.py", 27, "_init_dist_pytorch", "rank = int(os.environ['RANK'])"),
          ("/usr/local/src/python37/lib/python3.7/os.py", 678, "__getitem__", "raise KeyError(key) from None")],
         "KeyError: 'RANK'"))

add("no-launcher-os-system", "no-launcher-env",
    "started with os.system(python train.py): use the colossalai/torchrun launcher, or set RANK, "
    "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT yourself",
    "hpcaitech/ColossalAI#1113", "launch", "python",
    tb([U(31, "main", "colossalai.launch_from_torch(config=args.config)"),
        ("colossalai/initialize.py", 210, "launch_from_torch", "rank = int(os.environ['RANK'])")],
       "KeyError: 'RANK'\n\nDuring handling of the above exception, another exception occurred:\n")
    + tb([U(31, "main", "colossalai.launch_from_torch(config=args.config)"),
          ("colossalai/initialize.py", 217, "launch_from_torch", "raise RuntimeError(")],
         "RuntimeError: Could not find 'RANK' in the torch environment, visit https://www.colossalai.org/ for more "
         "information on launching with torch"))

add("no-launcher-master-addr", "no-launcher-env",
    "run the script through torchrun (or export MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE) instead of python",
    "pytorch/pytorch#74824", "launch", "python",
    ["$ python train_elastic.py"]
    + tb([U(38, "train", "dist.init_process_group(backend='nccl')", "train_elastic.py")] + INIT
         + [("torch/distributed/rendezvous.py", 258, "_env_rendezvous_handler", "master_addr = _get_env_or_raise(\"MASTER_ADDR\")")],
         "ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable MASTER_ADDR expected, but not set"))

add("slurm-devices-vs-ntasks", "slurm-tasks-mismatch",
    "make Lightning's devices equal to #SBATCH --ntasks-per-node (one task per GPU)",
    "Lightning-AI/pytorch-lightning#19883", "launch", "slurm+lightning",
    slurm([(None, "#SBATCH --gres=gpu:2 --nodes=1 --ntasks-per-node=1"),
           (None, "Using 16bit Automatic Mixed Precision (AMP)")]
          + [(None, x) for x in tb([U(52, "<module>", "trainer.fit(model, datamodule)", "train_lightning.py"),
                                   ("lightning/pytorch/trainer/connectors/accelerator_connector.py", 690, "_lazy_init_strategy",
                                    "self.cluster_environment.validate_settings(num_devices=self._parallel_devices_count, num_nodes=self._num_nodes_flag)"),
                                   ("lightning/fabric/plugins/environments/slurm.py", 169, "validate_settings", "raise ValueError(")],
                                  "ValueError: You set `devices=2` in Lightning, but the number of tasks per node configured in "
                                  "SLURM `--ntasks-per-node=1` does not match. HINT: Set `devices=1`.")],
          fails=((0, 1),)))

add("slurm-ntasks-lt-per-node", "slurm-tasks-mismatch",
    "--ntasks=1 with --ntasks-per-node=2 starts one task while Lightning waits for two: make --ntasks equal "
    "nodes x ntasks-per-node (or drop --ntasks)",
    "Lightning-AI/pytorch-lightning#20391", "launch", "slurm+lightning",
    slurm([(None, "LOCAL_RANK=0, SLURM_NTASKS=1, SLURM_NTASKS_PER_NODE=2"), (None, "trainer.num_devices: 2")]
          + [(None, x) for x in lightning_banner(2)[:3]]
          + [(None, "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2"),
             (None, "slurmstepd: error: *** STEP 4412873.0 ON gpu-a-017 CANCELLED AT 2024-11-04T14:03:11 DUE TO TIME LIMIT ***")],
          fails=((0, "Killed"),)))

add("slurm-lightning-old-warning", "slurm-tasks-mismatch",
    "let Slurm start one task per GPU: --ntasks-per-node equal to the GPUs per node",
    "Lightning-AI/pytorch-lightning#102", "launch", "slurm+lightning",
    ["UserWarning: ", "You requested 2 GPUs but launched 1 slurm tasks.", "We will launch 2 processes for you.",
     "We recommend you let slurm manage the processes by setting: --ntasks-per-node=2",
     "If you're not using SLURM, ignore this message!", "  warnings.warn(msg)"])

add("slurm-nodes-mismatch-store-barrier", "slurm-tasks-mismatch",
    "Slurm started one node while the Trainer expects num_nodes=2 (world 8): set #SBATCH --nodes and "
    "--ntasks-per-node to match num_nodes and devices",
    "Lightning-AI/pytorch-lightning#10098", "launch", "slurm+lightning",
    slurm([(None, x) for x in lightning_banner(8, rank_lines=False)[:3]]
          + [(None, f"initializing ddp: GLOBAL_RANK: {r}, MEMBER: {r + 1}/8") for r in range(4)]
          + [(None, x) for x in tb([U(77, "<module>", "trainer.fit(model, dm)", "main.py"),
                                   ("pytorch_lightning/plugins/training_type/ddp.py", 284, "init_ddp_connection",
                                    "torch_distrib.init_process_group(self.torch_distributed_backend, rank=global_rank, world_size=world_size)"),
                                   ("torch/distributed/distributed_c10d.py", 525, "init_process_group", "_store_based_barrier(rank, store, timeout)"),
                                   ("torch/distributed/distributed_c10d.py", 212, "_store_based_barrier", "raise RuntimeError(")],
                                  "RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for "
                                  "key: store_based_barrier_key:1 (world_size=8, worker_count=4, timeout=0:30:00)")],
          fails=((0, 1), (1, 1), (2, 1), (3, 1))))

SYNCBN_TB = [("torch/nn/modules/batchnorm.py", 732, "forward", "world_size = torch.distributed.get_world_size(process_group)")]

add("syncbn-eval-no-dist-old", "syncbn-single-process",
    "SyncBatchNorm needs a process group: convert it back to BatchNorm (or init a 1-process group) for "
    "single-process evaluation",
    "pytorch/pytorch#22538", "launch", "python",
    tb([U(200, "evaluate", "predictions = model(batch)", "eval.py"),
        ("/home/michaelp/.local/lib/python3.6/site-packages/torch/nn/modules/batchnorm.py", 455, "forward",
         "world_size = torch.distributed.get_world_size(process_group)"),
        ("/home/michaelp/.local/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 584, "get_world_size",
         "return _get_group_size(group)"),
        ("/home/michaelp/.local/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 191, "_check_default_pg",
         "\"Default process group is not initialized\"")],
       "AssertionError: Default process group is not initialized"),
    alt=("syncbn-cpu",), related=("no-default-process-group",))

add("syncbn-single-gpu-new", "syncbn-single-process",
    "on one GPU use plain BatchNorm (choose it by world size) or create a world_size=1 process group",
    "pytorch/pytorch#63662", "launch", "python",
    tb([U(41, "<module>", "out = model(x)", "debug_single_gpu.py")] + DDP_FWD[:2] + SYNCBN_TB
       + [("torch/distributed/distributed_c10d.py", 1769, "get_world_size", "return _get_group_size(group)"),
          ("torch/distributed/distributed_c10d.py", 841, "_get_group_size", "default_pg = _get_default_group()"),
          ("torch/distributed/distributed_c10d.py", 1008, "_get_default_group", "raise ValueError(")],
       "ValueError: Default process group has not been initialized, please make sure to call init_process_group."),
    alt=("syncbn-cpu",), related=("no-default-process-group",))

add("syncbn-mmrotate-config", "syncbn-single-process",
    "single-GPU training with a SyncBN config: change norm_cfg type 'SyncBN' to 'BN'",
    "zcablii/LSKNet#54", "launch", "python",
    ["$ python tools/train.py configs/lsknet/lsk_s_fpn_1x_dota_le90.py"]
    + tb([("tools/train.py", 192, "main", "train_detector("),
          ("mmrotate/apis/train.py", 143, "train_detector", "runner.run(data_loaders, cfg.workflow)"),
          ("mmcv/runner/epoch_based_runner.py", 29, "run_iter", "outputs = self.model.train_step(data_batch, self.optimizer,"),
          ("mmrotate/models/backbones/lsknet.py", 141, "forward", "x = self.norm1(x)")] + SYNCBN_TB
       + [("torch/distributed/distributed_c10d.py", 1004, "_get_default_group", "raise RuntimeError(")],
       "RuntimeError: Default process group has not been initialized, please make sure to call init_process_group."),
    alt=("syncbn-cpu",), related=("no-default-process-group",))

add("syncbn-mmseg-assert", "syncbn-single-process",
    "for one GPU replace SyncBN with BN in the config",
    "open-mmlab/mmsegmentation#354", "launch", "python",
    ["$ python tools/train.py configs/pspnet/pspnet_r50-d8_512x1024_40k_cityscapes.py"]
    + tb([("mmseg/models/backbones/resnet.py", 640, "forward", "x = self.stem(x)"),
          ("torch/nn/modules/batchnorm.py", 519, "forward", "world_size = torch.distributed.get_world_size(process_group)"),
          ("torch/distributed/distributed_c10d.py", 625, "get_world_size", "return _get_group_size(group)"),
          ("torch/distributed/distributed_c10d.py", 220, "_get_group_size", "_check_default_pg()"),
          ("torch/distributed/distributed_c10d.py", 211, "_check_default_pg", "\"Default process group is not initialized\"")],
       "AssertionError: Default process group is not initialized"),
    alt=("syncbn-cpu",), related=("no-default-process-group",))

add("syncbn-detnas-one-gpu", "syncbn-single-process",
    "with one GPU do not use SyncBN (use BN or GN)",
    "megvii-model/DetNAS#35", "launch", "python",
    tb([("tools/train_net.py", 174, "main", "model = train(cfg, args.local_rank, args.distributed)"),
        ("maskrcnn_benchmark/layers/sync_bn.py", 64, "forward", "return super().forward(x)")] + SYNCBN_TB[:0]
       + [("torch/nn/modules/batchnorm.py", 458, "forward", "world_size = torch.distributed.get_world_size(process_group)"),
          ("torch/distributed/distributed_c10d.py", 198, "_check_default_pg", "\"Default process group is not initialized\"")],
       "AssertionError: Default process group is not initialized"),
    alt=("syncbn-cpu",), related=("no-default-process-group",))

add("ddp-in-single-process-demo", "no-default-process-group",
    "the demo wraps the model in DistributedDataParallel without init_process_group: call it first (or "
    "drop DDP for one-process inference)",
    "CoinCheung/BiSeNet#70", "launch", "python",
    tb([("/home/jiapy/workspace/segmentation/BiSeNet/demo.py", 36, "<module>", "output_device=0     # output_device=args.local_rank"),
        ("/home/jiapy/virtualEnv/py3.6torch1.2/lib/python3.6/site-packages/torch/nn/parallel/distributed.py", 268, "__init__",
         "self.process_group = _get_default_group()"),
        ("/home/jiapy/virtualEnv/py3.6torch1.2/lib/python3.6/site-packages/torch/distributed/distributed_c10d.py", 273,
         "_get_default_group", "raise RuntimeError(\"Default process group has not been initialized, \"")],
       "RuntimeError: Default process group has not been initialized, please make sure to call init_process_group."))

# --------------------------------------------------------------------------------------------
# DDP and CUDA usage
# --------------------------------------------------------------------------------------------

CPU_BACKEND = "RuntimeError: No backend type associated with device type cpu"
BCAST = [("torch/distributed/c10d_logger.py", 75, "wrapper", "return func(*args, **kwargs)"),
         ("torch/distributed/distributed_c10d.py", 2140, "broadcast", "work = group.broadcast([tensor], opts)")]

add("cpu-tensor-nccl-broadcast", "cpu-tensor-nccl",
    "the broadcast tensor was created on CPU under the nccl backend: move it to the rank's GPU "
    "(torch.tensor(..., device='cuda')) or init with backend='cpu:gloo,cuda:nccl'",
    "mistralai/mistral-inference#252", "ddp-cuda", "torchrun",
    torchrun({r: tb([U(112, "generate", "dist.broadcast(length_tensor, src=0)", "mistral_inference/main.py")] + BCAST,
                    CPU_BACKEND) for r in (0, 1)}, 0, 1, script="mistral_inference/main.py", others=((1, 1),)))

add("cpu-tensor-nccl-recv-weights", "cpu-tensor-nccl",
    "recv() got a CPU tensor under nccl: receive into a CUDA tensor, or use a gloo group for CPU tensors",
    "THUDM/SwissArmyTransformer#173", "ddp-cuda", "torchrun",
    torchrun({1: tb([("/ssd/ylying/CogVLM/basic_demo/infer_dataset.py", 36, "main", "model, model_args = AutoModel.from_pretrained("),
                     ("sat/mpu/operation.py", 84, "iter_repartition", "torch.distributed.recv(sub_module.weight.data, src)"),
                     ("torch/distributed/distributed_c10d.py", 1640, "recv", "pg.recv([tensor], src, tag).wait()")],
                    CPU_BACKEND)}, 1, 1, fmt="mid", script="basic_demo/infer_dataset.py", others=((0, -15),)))

add("cpu-tensor-nccl-backend-default", "cpu-tensor-nccl",
    "collectives on CPU tensors with backend='nccl' only: leave backend=None (nccl for CUDA, gloo for CPU) "
    "or move the tensors to the GPU",
    "rwth-i6/returnn#1724", "ddp-cuda", "torchrun",
    torchrun({0: tb([("/home/user/returnn/returnn/torch/engine.py", 412, "_run_step",
                      "torch.distributed.all_reduce(num_seqs, op=torch.distributed.ReduceOp.SUM)"),
                     ("torch/distributed/distributed_c10d.py", 2288, "all_reduce", "work = group.allreduce([tensor], opts)")],
                    CPU_BACKEND)}, 0, 1, script="rnn.py", others=((1, -15),)))

add("cpu-tensor-nccl-cogvlm", "cpu-tensor-nccl",
    "a CPU tensor reached an NCCL collective after init: keep collective inputs on the rank's CUDA device",
    "zai-org/CogVLM#328", "ddp-cuda", "deepspeed",
    deepspeed({0: nccl_info("603760c1c291", 16949, 0, ["comm 0x55a3e20fdbf0 rank 0 nranks 10 cudaDev 0 busId 4f000 commId 0x714dd0f00c283118 - Init COMPLETE"])
               + tb([U(230, "main", "training_main(args, model_cls=model, forward_step_function=forward_step)", "finetune_demo/finetune_cogvlm_demo.py"),
                     ("sat/training/deepspeed_training.py", 340, "train", "dist.broadcast(flag, src=0)")] + BCAST, CPU_BACKEND)},
              1, ["finetune_demo/finetune_cogvlm_demo.py", "--deepspeed"], ranks=tuple(range(10))))

add("cpu-tensor-nccl-old-wording", "cpu-tensor-nccl",
    "NCCL only reduces CUDA tensors: call .cuda() on the tensor before all_reduce (or use gloo for CPU tensors)",
    "pytorch/pytorch#24005", "ddp-cuda", "launch",
    launch_legacy({0: tb([U(98, "reduce_loss", "dist.all_reduce(loss_sum)"),
                          ("torch/distributed/distributed_c10d.py", 907, "all_reduce", "work = _default_pg.allreduce([tensor], opts)")],
                         "RuntimeError: Tensors must be CUDA and dense")}, 0, 1, ["train.py"]))

add("cpu-model-ddp-device-ids", "cpu-tensor-nccl",
    "the model is still on the CPU when wrapped with device_ids=[0]: model.to(local_rank) before DDP(...)",
    "pytorch/examples#969", "ddp-cuda", "mp.spawn",
    spawn(0, tb([("/home/user/examples/imagenet/main.py", 190, "main_worker",
                  "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])"),
                 ("torch/nn/parallel/distributed.py", 731, "__init__", "self._log_and_throw(")],
                "ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
                "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], output_device 0, "
                "and module parameters {device(type='cpu')}."), script="main.py"))

TWICE = ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
         "reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model parameters "
         "are not shared across multiple concurrent forward-backward passes. or try to use _set_static_graph() as a "
         "workaround if this module graph does not change during training loop.2) Reused parameters in multiple "
         "reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part "
         "of your model, it would result in the same set of parameters been used by different reentrant backward "
         "passes multiple times, and hence marking a variable ready multiple times. DDP does not support such use "
         "cases in default. You can try to use _set_static_graph() as a workaround if your module graph does not "
         "change over iterations.\n{tail}")
TWICE_NAMED = ("Parameter at index {i} with name {n} has been marked as ready twice. This means that multiple autograd "
               "engine  hooks have fired for this particular parameter during this iteration.")
TWICE_IDX = ("Parameter at index {i} has been marked as ready twice. This means that multiple autograd engine  hooks "
             "have fired for this particular parameter during this iteration. You can set the environment variable "
             "TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to print parameter names for further debugging.")
CKPT_BWD = BACKWARD + [("torch/autograd/function.py", 289, "apply", "return user_fn(self, *args)"),
                       ("torch/utils/checkpoint.py", 319, "backward", "torch.autograd.backward(outputs_with_grad, args_with_grad)")]

add("ready-twice-focalnet", "ddp-reentrant-checkpoint",
    "reentrant activation checkpointing under DDP: use checkpoint(..., use_reentrant=False) or "
    "DDP(static_graph=True)",
    "microsoft/FocalNet#4", "ddp-cuda", "launch",
    torchrun({r: tb([U(180, "train_one_epoch", "loss.backward()", "main.py")] + CKPT_BWD,
                    TWICE.format(tail=TWICE_NAMED.format(i=440, n="backbone.backbone.layers.3.blocks.2.mlp.fc2.bias")))
              for r in (0, 1)}, 0, 1, fmt="old", launcher="launch", script="main.py", others=((1, 1),)))

add("ready-twice-dalle2-index", "ddp-reentrant-checkpoint",
    "gradient checkpointing needs a static graph under DDP: DDP(..., static_graph=True) or non-reentrant checkpoint",
    "lucidrains/DALLE2-pytorch#225", "ddp-cuda", "accelerate",
    torchrun({0: tb([U(211, "train", "accelerator.backward(loss)", "train_decoder.py"),
                     ("accelerate/accelerator.py", 1905, "backward", "loss.backward(**kwargs)")] + CKPT_BWD,
                    TWICE.format(tail=TWICE_IDX.format(i=753)))},
             0, 1, fmt="old", launcher="accelerate", script="train_decoder.py", others=((1, -15),)))

add("ready-twice-peft-accelerate", "ddp-reentrant-checkpoint",
    "with model.gradient_checkpointing_enable() under DDP pass gradient_checkpointing_kwargs="
    "{'use_reentrant': False} (or ddp_find_unused_parameters=False + static graph)",
    "huggingface/peft#313", "ddp-cuda", "accelerate",
    torchrun({r: tb([U(309, "main", "trainer.train()", "main.py"),
                     ("transformers/trainer.py", 2744, "training_step", "self.accelerator.backward(loss)"),
                     ("accelerate/accelerator.py", 1905, "backward", "loss.backward(**kwargs)")] + CKPT_BWD,
                    TWICE.format(tail=TWICE_IDX.format(i=55))) for r in (0, 1)},
             0, 1, fmt="old", launcher="accelerate", script="main.py", others=((1, 1),)))

add("ready-twice-accelerate-use-reentrant", "ddp-reentrant-checkpoint",
    "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})",
    "huggingface/accelerate#389", "ddp-cuda", "torchrun",
    torchrun({1: tb([U(140, "train", "loss.backward()")] + CKPT_BWD,
                    TWICE.format(tail=TWICE_NAMED.format(i=387, n="hf_model.roberta.encoder.layer.23.output.LayerNorm.weight")))},
             1, 1, others=((0, -15),)))

LONGFORMER = ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
              "reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model parameters "
              "are not shared across multiple concurrent forward-backward passes2) Reused parameters in multiple "
              "reentrant backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part "
              "of your model, it would result in the same set of parameters been used by different reentrant backward "
              "passes multiple times, and hence marking a variable ready multiple times. DDP does not support such use "
              "cases yet.3) Incorrect unused parameter detection. The return value of the `forward` function is "
              "inspected by the distributed data parallel wrapper to figure out if any of the module's parameters went "
              "unused. For unused parameters, DDP would not expect gradients from then. However, if an unused parameter "
              "becomes part of the autograd graph at a later point in time (e.g., in a reentrant backward when using "
              "`checkpoint`), the gradient will show up unexpectedly. If all parameters in the model participate in the "
              "backward pass, you can disable unused parameter detection by passing the keyword argument "
              "`find_unused_parameters=False` to `torch.nn.parallel.DistributedDataParallel`.")

add("ready-twice-longformer-lightning", "ddp-reentrant-checkpoint",
    "checkpointing with find_unused_parameters=True: pass find_unused_parameters=False (all parameters "
    "take part) so checkpoint's reentrant backward is not seen as a second gradient",
    "allenai/longformer#63", "ddp-cuda", "lightning",
    lightning_banner(2, old=True) + ["Epoch 1:   0%|          | 0/1250 [00:00<?, ?it/s]"]
    + tb([U(402, "main", "trainer.fit(model)", "scripts/triviaqa.py"),
          ("pytorch_lightning/trainer/training_loop.py", 455, "run_training_batch", "self.model_backward(loss, optimizer, opt_idx)")]
         + CKPT_BWD, LONGFORMER))

IBOT = ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the following "
        "reasons: 1) Use of a module parameter outside the `forward` function. Please make sure model parameters are "
        "not shared across multiple concurrent forward-backward passes2) Reused parameters in multiple reentrant "
        "backward passes. For example, if you use multiple `checkpoint` functions to wrap the same part of your "
        "model, it would result in the same set of parameters been used by different reentrant backward passes "
        "multiple times, and hence marking a variable ready multiple times. DDP does not support such use cases yet.")

add("ready-twice-ibot-interleaved", "ddp-reentrant-checkpoint",
    "activation checkpointing on a DDP model: disable use_checkpoint, or upgrade and use static_graph / "
    "non-reentrant checkpoint",
    "bytedance/ibot#30", "ddp-cuda", "launch",
    launch_legacy({r: tb([("main_ibot.py", 380, "train_one_epoch", "loss.backward()")] + CKPT_BWD, IBOT) for r in (0, 1)},
                  0, 1, ["main_ibot.py", "--arch", "vit_small", "--use_checkpoint", "true"],
                  python="/home/username/anaconda3/envs/py37/bin/python"))

add("ready-twice-oldest-wording", "ddp-reentrant-checkpoint",
    "checkpoint_sequential re-runs the forward in a reentrant backward that DDP (1.1) cannot track: drop "
    "checkpointing under DDP or move to a version with static_graph / use_reentrant=False",
    "pytorch/pytorch#24005", "ddp-cuda", "launch",
    launch_legacy({0: tb([U(179, "train", "loss.backward()", "minimal_buggy_2.py"),
                          ("/opt/conda/lib/python3.7/site-packages/torch/tensor.py", 107, "backward",
                           "torch.autograd.backward(self, gradient, retain_graph, create_graph)"),
                          ("/opt/conda/lib/python3.7/site-packages/torch/utils/checkpoint.py", 99, "backward",
                           "torch.autograd.backward(outputs, args)")],
                         "RuntimeError: Expected to mark a variable ready only once. This error is caused by use of a "
                         "module parameter outside the `forward` function. The return value of the `forward` function "
                         "is inspected by the distributed data parallel wrapper to figure out if any of the module's "
                         "parameters went unused. If this is the case, it knows they won't receive gradients in a "
                         "backward pass. If any of those parameters are then used outside `forward`, this error "
                         "condition is triggered. You can disable unused parameter detection by passing the keyword "
                         "argument `find_unused_parameters=False` to `torch.nn.parallel.DistributedDataParallel`.")},
                  0, 1, ["minimal_buggy_2.py"], python="/opt/conda/bin/python"))

FORK = ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
        "the 'spawn' start method")
WORKER_HEAD = [("torch/utils/data/dataloader.py", 631, "__next__", "data = self._next_data()"),
               ("torch/utils/data/dataloader.py", 1346, "_next_data", "return self._process_data(data)"),
               ("torch/utils/data/dataloader.py", 1372, "_process_data", "data.reraise()"),
               ("torch/_utils.py", 705, "reraise", "raise exception")]

add("cuda-fork-dataloader-voxel", "cuda-fork",
    "CUDA ran inside a forked DataLoader worker (point-to-voxel on GPU in the dataset): do it on CPU in the "
    "dataset, or use multiprocessing_context='spawn'",
    "traveller59/spconv#408", "ddp-cuda", "torchrun",
    torchrun({0: tb([U(121, "train_one_epoch", "batch = next(dataloader_iter)", "tools/train_utils/train_utils.py")] + WORKER_HEAD,
                    "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):")
              + ["  File \"/workspace/pcdet/datasets/processor/data_processor.py\", line 140, in transform_points_to_voxels",
                 "    voxel_output = self.voxel_generator.generate(points)", FORK]},
             0, 1, fmt="old", script="tools/train.py", others=((1, -15),)))

add("cuda-fork-pycls-pool", "cuda-fork",
    "CUDA was initialised in the parent before forking workers: start them with torch.multiprocessing."
    "set_start_method('spawn') (in the __main__ guard) or do not touch CUDA before the fork",
    "facebookresearch/pycls#183", "ddp-cuda", "python",
    tb([("tools/run_net.py", 48, "main", "dist.multi_proc_run(num_proc=cfg.NUM_GPUS, fun=trainer.train_model)"),
        ("pycls/core/distributed.py", 93, "run", "fun(*fun_args, **fun_kwargs)"),
        ("pycls/core/trainer.py", 52, "setup_env", "torch.cuda.set_device(dist.get_rank())"),
        ("torch/cuda/__init__.py", 204, "_lazy_init", "\"Cannot re-initialize CUDA in forked subprocess. \" + msg)")],
       FORK))

add("cuda-fork-flair", "cuda-fork",
    "the parent process used CUDA before forking: set the start method to spawn at the top of __main__",
    "flairNLP/flair#1316", "ddp-cuda", "python",
    tb([("train.py", 55, "worker", "embeddings.embed(sentences)"),
        ("flair/embeddings.py", 2871, "_add_embeddings_internal", "tokens_tensor = torch.tensor(indexed_tokens, device=flair.device)")],
       FORK))

add("cuda-fork-graphnet-lightning", "cuda-fork",
    "DataLoader workers forked after CUDA was used: pass multiprocessing_context='spawn' to the DataLoader",
    "graphnet-team/graphnet#614", "ddp-cuda", "lightning",
    lightning_banner(1, rank_lines=False)[:3] + ["Epoch  0:   0%|          | 0/1532 [00:00<?, ? batch(es)/s]"]
    + tb([U(141, "main", "model.fit(training_dataloader, validation_dataloader, gpus=[0])", "examples/04_training/01_train_model.py"),
          ("pytorch_lightning/loops/fetchers.py", 135, "_fetch_next_batch", "batch = next(iterator)")] + WORKER_HEAD,
         "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):")
    + ["  File \"/home/user/graphnet/src/graphnet/data/dataset.py\", line 320, in __getitem__",
       "    graph = self._create_graph(features, truth)", FORK])

add("cuda-fork-nano-vllm", "cuda-fork",
    "use mp.get_context('spawn') for the worker processes that touch CUDA",
    "GeeeekExplorer/nano-vllm#22", "ddp-cuda", "python",
    ["Process Process-1:"]
    + tb([("/usr/lib/python3.10/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
          ("nanovllm/engine/model_runner.py", 25, "__init__", "torch.cuda.set_device(rank)"),
          ("torch/cuda/__init__.py", 478, "set_device", "torch._C._cuda_setDevice(device)"),
          ("torch/cuda/__init__.py", 305, "_lazy_init", "raise RuntimeError(")],
         FORK))

UNUSED = ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This "
          "error indicates that your module has parameters that were not used in producing loss. You can enable unused "
          "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
          "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs participate "
          "in calculating loss. \nIf you already have done the above, then the distributed data parallel module wasn't "
          "able to locate the output tensors in the return value of your module's `forward` function. Please include "
          "the loss function and the structure of the return value of `forward` of your module when reporting this "
          "issue (e.g. list, dict, iterable).")

add("unused-cutie-names", "ddp-unused-parameters",
    "a module (mask_encoder.sensory_update) produced no loss this iteration: use it in the loss or pass "
    "find_unused_parameters=True",
    "hkchengrex/Cutie#125", "ddp-cuda", "torchrun",
    torchrun({3: tb([U(98, "do_pass", "out = self.cutie(data)", "cutie/model/trainer.py")] + DDP_FWD,
                    UNUSED + "\nParameters which did not receive grad for rank 3: mask_encoder.sensory_update.transform.bias, "
                    "mask_encoder.sensory_update.transform.weight\nParameter indices which did not receive grad for rank 3: 282 283")},
             3, 1, script="cutie/train.py", others=((0, -15), (1, -15), (2, -15))))

add("unused-unidet3d-halfway", "ddp-unused-parameters",
    "the bbox head gets no loss on batches without boxes: find_unused_parameters=True in the config (or a "
    "zero-weighted loss on it)",
    "filaPro/unidet3d#8", "ddp-cuda", "torchrun",
    ["11/19 23:23:52 - mmengine - INFO - Saving checkpoint at 486 epochs"]
    + torchrun({4: tb([U(135, "<module>", "main()", "tools/train.py"),
                       ("mmengine/model/wrappers/distributed.py", 121, "train_step", "losses = self._run_forward(data, mode='loss')")]
                      + DDP_FWD, UNUSED + "\nParameters which did not receive grad for rank 4: decoder.out_bboxes.linear.bias, "
                      "decoder.out_bboxes.linear.weight\nParameter indices which did not receive grad for rank 4: 311 312")},
               4, 1, script="tools/train.py", others=((0, -15),)))

add("unused-speechbrain-wavlm", "ddp-unused-parameters",
    "the last WavLM layers are not used by the loss: freeze or drop them, or find_unused_parameters=True",
    "speechbrain/speechbrain#2340", "ddp-cuda", "torchrun",
    torchrun({0: tb([U(410, "fit_batch", "outputs = self.compute_forward(batch, sb.Stage.TRAIN)", "train.py")] + DDP_FWD,
                    UNUSED + "\nParameters which did not receive grad for rank 0: model.encoder.layers.22.final_layer_norm.bias, "
                    "model.encoder.layers.22.final_layer_norm.weight, model.encoder.layers.22.feed_forward.output_dense.bias\n"
                    "Parameter indices which did not receive grad for rank 0: 390 391 392 393 394 395")},
             0, 1, fmt="mid", others=((1, -15),)))

add("unused-styleavatar-indices-only", "ddp-unused-parameters",
    "some generator parameters get no gradient each step: use them in the loss or pass find_unused_parameters=True",
    "LizhenWangT/StyleAvatar#16", "ddp-cuda", "torchrun",
    ["  0%|          | 1/800000 [00:33<7434:14:11, 33.45s/it]",
     "[rank1]: Parameter indices which did not receive grad for rank 1: 12 17 22 27 32 37 42 47 52 57"])

add("unused-fairchem-interleaved", "ddp-unused-parameters",
    "parameters unused in the loss (force head when only energy is trained): find_unused_parameters=True or "
    "use every output in the loss",
    "facebookresearch/fairchem#396", "ddp-cuda", "launch",
    [" In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL to print out "
     "information about which particular parameters did not receive gradient on this rank as part of this error",
     "  File \"/home/ubuntu/Softwares/anaconda3/envs/ocp-models/lib/python3.9/site-packages/torch/nn/parallel/distributed.py\", line 873, in forward",
     "    return forward_call(*input, **kwargs)Traceback (most recent call last):",
     "  File \"/home/ubuntu/ocp/Tianhua/main.py\", line 126, in <module>",
     "    if torch.is_grad_enabled() and self.reducer._rebuild_buckets():",
     "RuntimeError:     if torch.is_grad_enabled() and self.reducer._rebuild_buckets():Expected to have finished "
     "reduction in the prior iteration before starting a new one. This error indicates that your module has "
     "parameters that were not used in producing loss. You can enable unused parameter detection by passing the "
     "keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by ",
     "Killing subprocess 51220", "Killing subprocess 51221"])

add("unused-frozen-requires-grad", "ddp-unused-parameters",
    "parameters frozen by requires_grad=False in paramwise_cfg still count for DDP: set find_unused_parameters=True "
    "or freeze them before wrapping the model",
    "open-mmlab/mmengine#767", "ddp-cuda", "torchrun",
    torchrun({0: tb([U(121, "<module>", "main()", "tools/train.py"),
                     ("mmengine/runner/loops.py", 113, "run_iter", "outputs = self.runner.model.train_step(")] + DDP_FWD,
                    UNUSED + "\nParameter indices which did not receive grad for rank 0: 0 1 2 3 4 5 6 7")},
             0, 1, fmt="old", script="tools/train.py", others=((1, -15),)))

add("unused-already-on-no-grad-call", "ddp-unused-already-on",
    "find_unused_parameters=True is already on: the parameters ran under torch.no_grad in a custom __call__, so "
    "DDP never saw their outputs; make them take part in the loss (even x0) or freeze/remove them",
    "pytorch/pytorch#43259", "ddp-cuda", "torchrun",
    ["2022-06-15 09:12:01 INFO model = DistributedDataParallel(model, device_ids=[local_rank], find_unused_parameters=True)"]
    + torchrun({1: tb([U(201, "train_step", "outputs = model(images)")] + DDP_FWD, UNUSED)},
               1, 1, others=((0, -15),)),
    related=("ddp-unused-parameters",))

add("unused-already-on-mmdet-freeze", "ddp-unused-already-on",
    "find_unused_parameters = True is already in the config and training still fails: remove or freeze "
    "(requires_grad=False before DDP) the head that never gets a loss",
    "open-mmlab/mmdetection#7803", "ddp-cuda", "launch",
    ["2022-04-20 10:01:55,112 - mmdet - INFO - find_unused_parameters = True",
     "2022-04-20 10:01:55,113 - mmdet - INFO - Config: model = dict(type='FasterRCNN', roi_head=dict(type='StandardRoIHead'))"]
    + launch_legacy({0: tb([("tools/train.py", 190, "main", "train_detector("),
                            ("mmdet/apis/train.py", 208, "train_detector", "runner.run(data_loaders, cfg.workflow)")] + DDP_FWD,
                           UNUSED + "\nParameter indices which did not receive grad for rank 0: 212 213 214 215")},
                    0, 1, ["tools/train.py", "configs/faster_rcnn_r50_fpn_1x_coco.py", "--launcher", "pytorch"]),
    related=("ddp-unused-parameters",))

OOM_OLD = ("RuntimeError: CUDA out of memory. Tried to allocate {a} (GPU 0; {t} total capacity; {u} already allocated; "
           "{f} free; {r} reserved in total by PyTorch)")

add("oom-gpu0-load-before-set-device", "cuda-oom-gpu0",
    "every process loaded its parameters onto GPU 0 before set_device: call torch.cuda.set_device(local_rank) "
    "first and torch.load(..., map_location=...)",
    "NVIDIA/apex#222", "ddp-cuda", "launch",
    launch_legacy({3: tb([U(71, "main", "model.load_state_dict(torch.load(args.resume))"),
                          ("torch/serialization.py", 387, "load", "return _load(f, map_location, pickle_module, **pickle_load_args)")],
                         OOM_OLD.format(a="20.00 MiB", t="10.76 GiB", u="9.81 GiB", f="9.44 MiB", r="9.90 GiB"))},
                  3, 1, ["main.py", "--resume", "ckpt.pth"]))

add("oom-gpu0-model-to-cuda-before-ddp", "cuda-oom-gpu0",
    "the model was moved to 'cuda' (GPU 0) in every process before DDP: place it on cuda:LOCAL_RANK",
    "huggingface/sentence-transformers#3245", "ddp-cuda", "torchrun",
    torchrun({1: tb([U(22, "<module>", "model = SentenceTransformer(model_name)", "script.py"),
                     ("sentence_transformers/SentenceTransformer.py", 347, "__init__", "self.to(device)")],
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 250.00 MiB. GPU 0 has a total capacity "
                    "of 23.64 GiB of which 51.06 MiB is free. Process 2201 has 11.80 GiB memory in use. Process 2202 has "
                    "11.78 GiB memory in use. Of the allocated memory 11.31 GiB is allocated by PyTorch, and 77.03 MiB is "
                    "reserved by PyTorch but unallocated.")},
             1, 1, script="script.py", others=((0, -15),)))

add("oom-gpu0-resume-map-location", "cuda-oom-gpu0",
    "torch.load of the checkpoint put every rank's copy on GPU 0: load with map_location=device",
    "ashkamath/mdetr#41", "ddp-cuda", "launch",
    torchrun({5: tb([U(480, "main", "checkpoint = torch.load(args.resume, map_location='cpu' if args.cpu else None)", "main.py"),
                     ("torch/serialization.py", 607, "load", "return _load(opened_zipfile, map_location, pickle_module, **pickle_load_args)")],
                    OOM_OLD.format(a="64.00 MiB", t="23.70 GiB", u="21.98 GiB", f="30.56 MiB", r="22.31 GiB"))},
             5, 1, fmt="old", launcher="launch", script="main.py"))

# --------------------------------------------------------------------------------------------
# Killed by memory; /dev/shm
# --------------------------------------------------------------------------------------------

def ds_killed(args, ranks=(0, 1), rc=-9, pre=()):
    return deepspeed({}, rc, args, ranks=ranks, pre=pre)


add("host-oom-deepspeed-gptj", "host-oom",
    "the host ran out of RAM (return code -9 = SIGKILL from the OOM killer) while partitioning/offloading: "
    "add RAM or swap, or reduce CPU offload",
    "deepspeedai/DeepSpeed#3160", "memory", "deepspeed",
    ["[2023-04-07 13:08:55,469] [INFO] [utils.py:838:see_memory_usage] CPU Virtual Memory:  used = 28.43 GB, percent = 22.6%",
     "Rank: 0 partition count [1] and sizes[(6049711186, False)]"]
    + ds_killed(["run_clm.py", "--deepspeed", "ds_config_stage2_hf.json", "--model_name_or_path", "EleutherAI/gpt-j-6B"], ranks=(0,)),
    alt=("killed-by-signal",))

add("host-oom-deepspeed-zero3-offload", "host-oom",
    "ZeRO-3 offloading both optimizer states and parameters overflows host RAM: keep parameters on GPU, "
    "offload to NVMe, or add memory",
    "deepspeedai/DeepSpeed#4239", "memory", "deepspeed",
    ["[2023-08-30 02:11:45,201] [INFO] [utils.py:803:see_memory_usage] CPU Virtual Memory:  used = 487.01 GB, percent = 96.6%"]
    + ds_killed(["train.py", "--deepspeed", "ds_z3_offload.json"], ranks=(0, 1, 2, 3, 4, 5, 6, 7)),
    alt=("killed-by-signal",))

add("host-oom-llamafactory-z3-offload", "host-oom",
    "the CPU RAM (252 GB) filled up under ZeRO-3 offload: add system memory or offload less",
    "hiyouga/LlamaFactory#4629", "memory", "deepspeed",
    ds_killed(["src/train.py", "--deepspeed", "examples/deepspeed/ds_z3_offload_config.json", "--stage", "sft"], ranks=(0,)),
    alt=("killed-by-signal",))

add("host-oom-resume-checkpoint", "host-oom",
    "resuming loads every rank's copy of the optimizer state into host RAM: add RAM/swap or load on fewer ranks",
    "huggingface/transformers#17258", "memory", "deepspeed",
    ["[INFO|deepspeed.py:449] 2022-05-15 00:12:20,447 >> Attempting to resume from finetuned/checkpoint-22",
     "[2022-05-15 00:12:51,292] [INFO] [engine.py:2754:_get_all_zero_checkpoint_state_dicts] successfully read 2 ZeRO state_dicts for rank 0"]
    + ds_killed(["run_clm.py", "--deepspeed", "ds_config_gptj6b.json", "--model_name_or_path", "EleutherAI/gpt-j-6B"]),
    alt=("killed-by-signal",))

add("host-oom-torchrun-old-format", "host-oom",
    "the training process was killed for lack of host memory: use a machine with more RAM or a smaller model/batch",
    "OceannTwT/ra-isf#11", "memory", "torchrun",
    ["WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 5344 closing signal SIGTERM",
     "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 0 (pid: 5343) of binary: /root/miniconda3/bin/python",
     "Traceback (most recent call last):", '  File "/root/miniconda3/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
     "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
     "======================================================", "train.py FAILED",
     "------------------------------------------------------", "Failures:", "  <NO_OTHER_FAILURES>",
     "------------------------------------------------------", "Root Cause (first observed failure):", "[0]:",
     "  time      : 2024-06-25_14:21:09", "  host      : autodl-container-7a1f", "  rank      : 0 (local_rank: 0)",
     "  exitcode  : -9 (pid: 5343)", "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 5343",
     "======================================================"],
    alt=("killed-by-signal",))

add("host-oom-torchrun-mid-agent-line", "host-oom",
    "not enough host memory for the run: reduce memory use or add RAM",
    "AkariAsai/self-rag#83", "memory", "torchrun",
    ["[2024-06-15 10:02:33,112] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 0 "
     "(pid: 14447) of binary: /home/user/anaconda3/envs/selfrag/bin/python"],
    alt=("killed-by-signal",))

add("host-oom-colossalai-rank3", "host-oom",
    "rank 3 was SIGKILLed by the kernel's OOM killer while loading the model: more host RAM or lazy/sharded loading",
    "hpcaitech/ColossalAI#3514", "memory", "torchrun",
    torchrun({}, 3, -9, fmt="old", others=((0, -15), (1, -15), (2, -15)), script="train_sft.py"),
    alt=("killed-by-signal",))

add("host-oom-slurm-cgroup", "host-oom",
    "the job's Slurm memory request (--mem-per-cpu=4G x 2 CPUs) is below what the model needs: raise --mem / "
    "--mem-per-cpu",
    "pytorch/pytorch#8976", "memory", "slurm",
    slurm([(0, x) for x in tb([U(88, "train", "for x, y in loader:"),
                               ("torch/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()")],
                              "RuntimeError: DataLoader worker (pid 45128) is killed by signal: Killed.")],
          tail=["slurmstepd: error: Detected 1 oom_kill event in StepId=4412873.0. Some of the step tasks have been OOM Killed."],
          fails=((0, "Out Of Memory"),)),
    alt=("killed-by-signal",))

add("host-oom-dataloader-kraken", "host-oom",
    "the cluster's memory limit killed the DataLoader workers: request more memory or use fewer workers",
    "mittagessen/kraken#266", "memory", "python",
    tb([("kraken/lib/train.py", 412, "run", "for batch in self.train_set:"),
        ("torch/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()")],
       "RuntimeError: DataLoader worker (pid 22048) is killed by signal: Killed."),
    alt=("killed-by-signal",))

add("host-oom-mmrotate-dist-train", "host-oom",
    "distributed data loading needs more host RAM than the 16 GB machine has: more RAM or fewer workers/GPUs",
    "open-mmlab/mmrotate#501", "memory", "launch",
    torchrun({0: tb([("mmcv/runner/epoch_based_runner.py", 49, "train", "for i, data_batch in enumerate(self.data_loader):"),
                     ("torch/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()")],
                    "RuntimeError: DataLoader worker (pid 3112) is killed by signal: Killed.")},
             0, 1, fmt="old", launcher="launch", script="tools/train.py", prefix=False),
    alt=("killed-by-signal",))

add("host-oom-dataloader-dcpdn", "host-oom",
    "16 GB of RAM is not enough for the workers: set num_workers=0 (or add memory)",
    "hezhangsprinter/DCPDN#12", "memory", "python",
    tb([("train.py", 210, "<module>", "val_target_cpu, val_input_cpu = val_target_cpu.float().cuda(), val_input_cpu.float().cuda()"),
        ("/home/littlemonster/anaconda3/envs/pic/lib/python2.7/site-packages/torch/utils/data/dataloader.py", 175,
         "handler", "_error_if_any_worker_fails()")],
       "RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed."),
    alt=("killed-by-signal",))

BUS_OLD = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm)."
BUS_RT = "RuntimeError: DataLoader worker (pid {p}) is killed by signal: Bus error."
BUS_RT_NEW = ("RuntimeError: DataLoader worker (pid {p}) is killed by signal: Bus error. It is possible that dataloader's "
              "workers are out of shared memory. Please try to raise your shared memory limit.")
SIG_HANDLER = [("torch/utils/data/_utils/signal_handling.py", 66, "handler", "_error_if_any_worker_fails()")]

add("shm-bus-pipedream", "shm-too-small",
    "/dev/shm is too small for the DataLoader workers: run the container with --ipc=host or --shm-size",
    "msr-fiddle/pipedream#28", "memory", "torchrun",
    ["Epoch 0: 6843.771 seconds", BUS_OLD, BUS_OLD, BUS_OLD]
    + tb([("main_with_runtime.py", 380, "train", "input = next(loader_iter)"),
          ("/opt/conda/lib/python3.6/site-packages/torch/utils/data/dataloader.py", 480, "_try_get_batch",
           "data = self.data_queue.get(timeout=timeout)")] + SIG_HANDLER, BUS_RT.format(p=325), site="/opt/conda/lib/python3.6/site-packages"))

add("shm-bus-kubernetes", "shm-too-small",
    "Kubernetes pods get a 64 MB /dev/shm: mount an emptyDir with medium: Memory at /dev/shm",
    "pytorch/pytorch#16979", "memory", "python",
    [BUS_OLD]
    + tb([("train.py", 210, "train", "for input_dict in self.train_loader:"),
          ("/usr/local/lib/python2.7/dist-packages/torch/utils/data/dataloader.py", 631, "__next__", "idx, batch = self._get_batch()"),
          ("/usr/local/lib/python2.7/dist-packages/torch/utils/data/dataloader.py", 274, "handler", "_error_if_any_worker_fails()")],
         BUS_RT.format(p=125)))

add("shm-bus-docker-shm-size", "shm-too-small",
    "raise the container's shared memory (docker run --shm-size=8g or --ipc=host)",
    "nianticlabs/simplerecon#3", "memory", "python",
    [BUS_OLD] + tb([("train.py", 241, "main", "trainer.fit(model, datamodule)")] + SIG_HANDLER, BUS_RT_NEW.format(p=1433)))

add("shm-bus-protenix-new-wording", "shm-too-small",
    "the default docker /dev/shm (64 MB) is too small: add -v /dev/shm:/dev/shm or --shm-size=128g",
    "bytedance/Protenix#2", "memory", "python",
    tb([("runner/inference.py", 210, "main", "for batch in dataloader:"),
        ("torch/utils/data/dataloader.py", 1133, "_try_get_data", "data = self._data_queue.get(timeout=timeout)")] + SIG_HANDLER,
       BUS_RT_NEW.format(p=572)))

add("shm-bus-voxceleb", "shm-too-small",
    "insufficient shared memory for the loader workers: increase /dev/shm (docker --shm-size)",
    "clovaai/voxceleb_trainer#83", "memory", "python",
    [BUS_OLD]
    + tb([("/usr/local/lib/python3.6/dist-packages/torch/utils/data/dataloader.py", 872, "_try_get_data",
           "data = self._data_queue.get(timeout=timeout)"),
          ("/usr/local/lib/python3.6/dist-packages/torch/utils/data/_utils/signal_handling.py", 66, "handler",
           "_error_if_any_worker_fails()")], BUS_RT_NEW.format(p=3867)))

SHM_NCCL = "Error while creating shared memory segment /dev/shm/nccl-{s} (size {n})"

add("nccl-shm-ci-pods", "shm-too-small",
    "the pod's /dev/shm is full (No space left on device): mount a larger tmpfs at /dev/shm",
    "pytorch/ci-infra#490", "memory", "torchrun",
    torchrun({0: ["runner-g4sfw-workflow:202016:202235 [0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend "
                  "/dev/shm/nccl-WU88OE to 9637892 bytes, error: No space left on device (28)",
                  "runner-g4sfw-workflow:202016:202235 [0] misc/shmutils.cc:132 NCCL WARN " + SHM_NCCL.format(s="WU88OE", n=9637888)
                  + ", error: No space left on device (28)"]
              + tb([U(40, "test_allreduce", "dist.all_reduce(t)", "test/distributed/test_c10d_nccl.py")],
                   nccl_exc("system", SHM_NCCL.format(s="WU88OE", n=9637888) + ", error: No space left on device (28)",
                            ver="2.27.5", where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77"))},
             0, 1, script="test/distributed/test_c10d_nccl.py", others=((1, -15), (2, -15), (3, -15))),
    alt=("nccl-system-error",))

add("nccl-shm-5090-container", "shm-too-small",
    "NCCL could not create its shared-memory segment: give the container enough /dev/shm (--shm-size or --ipc=host)",
    "NVIDIA/nccl#1683", "memory", "torchrun",
    torchrun({r: tb([U(60, "setup", "dist.barrier()")],
                    nccl_exc("system", SHM_NCCL.format(s="aB3xQ1", n=7340384), ver="2.26.2",
                             where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77")) for r in (0, 1, 2, 3)},
             0, 1, others=((1, 1), (2, 1), (3, 1))),
    alt=("nccl-system-error",))

add("nccl-shm-torchtitan-16mb", "shm-too-small",
    "the CI container's /dev/shm is 16 MB: run it with --shm-size=1g",
    "pytorch/torchtitan#853", "memory", "torchrun",
    torchrun({0: tb([U(273, "main", "train_state = trainer.train()", "torchtitan/train.py")],
                    nccl_exc("system", SHM_NCCL.format(s="1YsMbG", n=7340384), ver="2.21.5",
                             where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268")
                    + "\nException raised from create at /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268 (most recent call first):")},
             0, 1, script="torchtitan/train.py", others=tuple((r, -15) for r in range(1, 8))),
    alt=("nccl-system-error",))

add("nccl-shm-easyr1-ray", "shm-too-small",
    "increase /dev/shm for the Ray containers (NCCL needs several MB per peer)",
    "hiyouga/EasyR1#228", "memory", "ray",
    ["(WorkerDict pid=868697) " + SHM_NCCL.format(s="UmqSM9", n=7340384),
     "(WorkerDict pid=868697) " + nccl_exc("system", SHM_NCCL.format(s="UmqSM9", n=7340384), ver="2.21.5").splitlines()[0]],
    alt=("nccl-system-error",))

add("nccl-sigbus-docker-pipedream", "shm-too-small",
    "NCCL hit a bus error in shared memory: docker's default /dev/shm is 64 MB; run with --shm-size=6g",
    "msr-fiddle/pipedream#76", "memory", "torchrun",
    ["[8d6bf97c3bf4:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)",
     "==== backtrace (tid:   3095) ====", " 0 0x0000000000043090 killpg()  ???:0",
     " 2 0x000000000007587d ncclGroupEnd()  ???:0", " 4 0x0000000000059e97 ncclGetUniqueId()  ???:0",
     " 5 0x00000000000489b1 ???()  /usr/lib/x86_64-linux-gnu/libnccl.so.2:0"]
    + torchrun({}, 0, -7, fmt="old", others=((1, -15),), script="main_with_runtime.py"),
    alt=("killed-by-signal",))

add("nccl-sigbus-megatron", "shm-too-small",
    "the container's /dev/shm is too small for NCCL: --shm-size (or --ipc=host)",
    "NVIDIA/Megatron-LM#516", "memory", "torchrun",
    ["[node-7:5275 :0:5301] Caught signal 7 (Bus error: nonexistent physical address)",
     " 1 0x000000000008170d ncclGroupEnd()  ???:0", " 2 0x00000000000742f0 ncclGroupEnd()  ???:0",
     " 3 0x0000000000008609 start_thread()  ???:0"]
    + torchrun({}, 0, -7, fmt="old", script="/workspace/Megatron-LM/pretrain_gpt.py"),
    alt=("killed-by-signal",))

add("nccl-sigbus-vllm-tp", "shm-too-small",
    "ncclShmOpen failed for lack of shared memory in docker: --shm-size=10gb",
    "vllm-project/vllm#1710", "memory", "python",
    ["(RayWorker pid=1612) *** SIGBUS received at time=1700212345 on cpu 3 ***",
     "(RayWorker pid=1612) PC: @     0x7f45d7e3cf3b  (unknown)  ncclShmOpen()",
     "(RayWorker pid=1612) Fatal Python error: Bus error"],
    alt=("killed-by-signal",))

SEMLOCK = [("/usr/lib/python3.10/multiprocessing/synchronize.py", 57, "__init__",
            "sl = self._semlock = _multiprocessing.SemLock(")]

add("shm-permission-aid", "shm-permission",
    "the user cannot write /dev/shm (POSIX semaphores live there): fix its permissions (chmod 1777 /dev/shm) "
    "or run single-process",
    "aidlearning/AidLearning-FrameWork#47", "memory", "python",
    tb([("faceID.py", 116, "run_single_camera", "q = Queue()"),
        ("/usr/lib/python2.7/multiprocessing/queues.py", 63, "__init__", "self._rlock = Lock()"),
        ("/usr/lib/python2.7/multiprocessing/synchronize.py", 75, "__init__", "sl = self._semlock = _multiprocessing.SemLock(kind, value, maxvalue)")],
       "OSError: [Errno 13] Permission denied"))

add("shm-permission-travis-tmpfs", "shm-permission",
    "/dev/shm is not a writable tmpfs here: mount one (mount -t tmpfs none /dev/shm)",
    "travis-ci/travis-cookbooks#241", "memory", "python",
    tb([("gslib/util.py", 546, "MultiprocessingIsAvailable", "multiprocessing.Value('i', 0)"),
        ("/usr/lib/python2.7/multiprocessing/synchronize.py", 172, "__init__", "SemLock.__init__(self, RECURSIVE_MUTEX, 1, 1)"),
        ("/usr/lib/python2.7/multiprocessing/synchronize.py", 75, "__init__", "sl = self._semlock = _multiprocessing.SemLock(kind, value, maxvalue)")],
       "OSError: [Errno 13] Permission denied"))

add("shm-permission-mode-755", "shm-permission",
    "/dev/shm is mounted with mode 755: make it 1777 (drwxrwxrwt)",
    "celery/billiard#288", "memory", "torchrun",
    torchrun({0: tb([U(150, "train", "for batch in train_loader:"),
                     ("torch/utils/data/dataloader.py", 439, "__iter__", "return self._get_iterator()"),
                     ("torch/utils/data/dataloader.py", 1085, "__init__", "self._worker_result_queue = multiprocessing_context.Queue()"),
                     ("/usr/lib/python3.10/multiprocessing/queues.py", 43, "__init__", "self._rlock = ctx.Lock()")] + SEMLOCK,
                    "PermissionError: [Errno 13] Permission denied")},
             0, 1, others=((1, 1),)))

add("shm-permission-missing-mount", "shm-permission",
    "/dev/shm is not available inside the sandbox: bind a writable directory to /dev/shm",
    "nix-community/nix-on-droid#138", "memory", "python",
    tb([("train.py", 31, "main", "loader = DataLoader(ds, num_workers=2)"),
        ("/usr/lib/python3.10/multiprocessing/synchronize.py", 75, "__init__", "sl = self._semlock = _multiprocessing.SemLock(kind, value, maxvalue)")],
       "PermissionError: [Errno 13] Permission denied"))

# --------------------------------------------------------------------------------------------
# Timeouts caused by a long task on one rank
# --------------------------------------------------------------------------------------------

def watchdog(rank, seq, op, numel, timeout_ms, ran_ms, new=True):
    if new:
        return (f"[rank{rank}]:[E0204 10:31:02.118273612 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
                f"Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out.")
    return (f"[E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
            f"OpType={op}, NumelIn={numel}, NumelOut={numel}, Timeout(ms)={timeout_ms}) ran for {ran_ms} milliseconds before timing out.")


TAKEDOWN = ["[E ProcessGroupNCCL.cpp:489] Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
            "[E ProcessGroupNCCL.cpp:495] To avoid data inconsistency, we are taking the entire process down."]

add("slow-rank0-tokenize-llamafactory", "slow-rank-timeout",
    "rank 0 tokenized the dataset for 30 minutes while the others waited at a barrier: preprocess once before "
    "the distributed run (cache it) or raise the timeout (--ddp_timeout / timeout= in init_process_group)",
    "hiyouga/LlamaFactory#2424", "timeout", "accelerate",
    ["Running tokenizer on dataset:   9%|▊         | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]"
     + watchdog(2, 2, "ALLREDUCE", 1, 1800000, 1800328, new=False),
     watchdog(1, 2, "ALLREDUCE", 1, 1800000, 1800572, new=False),
     "Running tokenizer on dataset:   0%|          | 0/2969526 [00:00<?, ? examples/s]"
     + watchdog(3, 2, "ALLREDUCE", 1, 1800000, 1800655, new=False)] + TAKEDOWN
    + torchrun({}, 1, -6, fmt="old", launcher="accelerate", script="src/train_bash.py", others=((0, -15), (2, -6), (3, -6))),
    related=("nccl-watchdog-timeout", "killed-by-signal"))

add("slow-rank0-tokenize-medicalgpt", "slow-rank-timeout",
    "the 30-minute default timeout expired during tokenization on the main process: tokenize and cache on one "
    "process first, or raise ddp_timeout",
    "shibing624/MedicalGPT#129", "timeout", "torchrun",
    ["[rank0]: Running tokenizer on dataset (num_proc=8):  61%|██████    | 1220000/2000000 [29:58<19:10, 678.12 examples/s]",
     watchdog(1, 1, "BROADCAST", 1, 1800000, 1800091), watchdog(2, 1, "BROADCAST", 1, 1800000, 1800093)]
    + torchrun({}, 1, -6, others=((0, -15), (2, -6)), script="supervised_finetuning.py"),
    related=("nccl-watchdog-timeout", "killed-by-signal"))

add("slow-rank0-socket-timeout-store", "slow-rank-timeout",
    "the main process was still mapping the dataset when the others timed out waiting: preprocess before "
    "launching, or pass a longer timeout to init_process_group",
    "huggingface/transformers#17106", "timeout", "launch",
    ["Running tokenizer on train dataset #0:  24%|██▍       | 7/29 [28:27<1:46:58, 291.73s/ba]"]
    + launch_legacy({1: tb([U(520, "main", "with training_args.main_process_first(desc=\"train dataset map pre-processing\"):",
                             "run_summarization.py"),
                            ("transformers/training_args.py", 1241, "main_process_first", "torch.distributed.barrier()"),
                            ("torch/distributed/distributed_c10d.py", 2420, "barrier", "work = default_pg.barrier(opts=opts)")],
                           "RuntimeError: Socket Timeout")}, 1, 1, ["run_summarization.py"]),
    related=("nccl-watchdog-timeout",))

add("slow-rank0-ncclid-store-get", "slow-rank-timeout",
    "rank 0 spent the timeout in datasets.map before creating the NCCL communicator: run the preprocessing "
    "first (or on every rank with a cache), or raise the timeout",
    "hiyouga/LlamaFactory#81", "timeout", "torchrun",
    ["Running tokenizer on dataset:  87%|████████▋ | 435000/500000 [29:40<04:26, 244.17 examples/s]"]
    + torchrun({1: tb([U(61, "main", "model = DDP(model)", "src/train_sft.py")] + DDP_INIT,
                      "RuntimeError: [1] is setting up NCCL communicator and retreiving ncclUniqueId from [0] via c10d "
                      "key-value store by key '0', but store->get('0') got error: Socket Timeout")},
               1, 1, fmt="old", script="src/train_sft.py"),
    related=("nccl-watchdog-timeout",))

add("slow-rank0-axolotl-tokenize", "slow-rank-timeout",
    "one process tokenized for longer than the default 10 minute NCCL timeout: preprocess ahead "
    "(axolotl preprocess) or raise ddp_timeout",
    "axolotl-ai-cloud/axolotl#2684", "timeout", "accelerate",
    ["[rank0]: Tokenizing Prompts (num_proc=64):  26%|██▌       | 93224/359152 [09:58<11:21, 391.89 examples/s]",
     "[rank1]:[E0520 11:02:45.321902111 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600049 milliseconds before timing out.",
     "[rank1]:[E0520 11:02:45.322190022 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure "
     "detected by watchdog at work sequence id: 1 PG status: last enqueued work: 1, last completed work: 0"]
    + torchrun({}, 1, -6, launcher="accelerate", script="axolotl/cli/train.py", others=((0, -15),)),
    related=("nccl-watchdog-timeout", "killed-by-signal"))

add("slow-weight-loading-sglang", "slow-rank-timeout",
    "loading 1.3 TB of weights took 20 minutes, past the 600 s default: pass timeout=timedelta(seconds=3600) to "
    "init_process_group (or load faster)",
    "sgl-project/sglang#3784", "timeout", "python",
    ["[2025-02-22 08:52:10 TP0] Load weight begin. avail mem=78.21 GB",
     "Loading safetensors checkpoint shards:  41% Completed | 67/163 [09:58<14:20,  8.96s/it]",
     "[rank8]:[E222 09:02:14.112032117 ProcessGroupNCCL.cpp:616] [Rank 8] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600091 milliseconds before timing out.",
     "[rank8]:[E222 09:02:14.112543018 ProcessGroupNCCL.cpp:630] [Rank 8] Some NCCL operations have failed or timed out. "
     "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data."],
    related=("nccl-watchdog-timeout",))

# --------------------------------------------------------------------------------------------
# Late cases: written after the catalogue was frozen (commit 964421c) from threads not read before;
# no pattern was written or changed for them. Their score is the out-of-sample measure.
# --------------------------------------------------------------------------------------------

LATE_FROM = len(CASES) + 1
EADDR_NEW = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use")

add("late-port-second-torchtune-run", "port-in-use",
    "a second run on the same machine uses the same default port 29500: give it another --master-port "
    "(or --rdzv-endpoint=localhost:0)",
    "meta-pytorch/torchtune#1025", "network", "torchrun",
    ["$ tune run --nproc_per_node 2 full_finetune_distributed --config llama3/8B_full"]
    + tb([("/usr/local/bin/tune", 8, "<module>", "sys.exit(main())"),
          ("torch/distributed/run.py", 892, "run", "elastic_launch("),
          ("torch/distributed/elastic/agent/server/api.py", 705, "_initialize_workers", "self._rendezvous(worker_group)"),
          ("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", 67, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
         "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
         "The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server socket "
         "has failed to bind to ?UNKNOWN? (errno: 98 - Address already in use)."))

add("late-port-vlm-r1-second-job", "port-in-use",
    "another training job already holds port 29500: pass a different --master_port to the second one",
    "om-ai-lab/VLM-R1#289", "network", "torchrun",
    ["+ torchrun --nproc_per_node=4 --nnodes=1 --node_rank=0 src/open_r1/grpo_rec.py --deepspeed local_scripts/zero3.json"]
    + tb([("/opt/conda/bin/torchrun", 8, "<module>", "sys.exit(main())"),
          ("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", 67, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
         EADDR_NEW.replace("torch.distributed.DistNetworkError", "RuntimeError")))

add("late-port-dist-kd-old-wording", "port-in-use",
    "the master port is taken by an earlier run that did not exit: kill it or choose another --master_port",
    "hunto/DIST_KD#10", "network", "torchrun",
    ["+ torchrun --nproc_per_node=2 --master_port=25641 tools/train.py -c configs/strategies/distill/dist_cifar.yaml",
     "WARNING:torch.distributed.run:",
     "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:25641 (errno: 98 - Address already in use).",
     "[W socket.cpp:426] [c10d] The server socket has failed to bind to 0.0.0.0:25641 (errno: 98 - Address already in use).",
     "[E socket.cpp:462] [c10d] The server socket has failed to listen on any local network address."]
    + tb([("/usr/local/bin/torchrun", 33, "<module>", "sys.exit(load_entry_point('torch==2.0.1', 'console_scripts', 'torchrun')())"),
          ("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", 55, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
         "RuntimeError: The server socket has failed to listen on any local network address. The server socket has "
         "failed to bind to [::]:25641 (errno: 98 - Address already in use). The server socket has failed to bind to "
         "0.0.0.0:25641 (errno: 98 - Address already in use)."))

ACC_STATE = [("accelerate/accelerator.py", 340, "__init__", "self.state = AcceleratorState("),
             ("accelerate/state.py", 539, "__init__", "PartialState(cpu, **kwargs)"),
             ("accelerate/state.py", 123, "__init__", "torch.cuda.set_device(self.device)")] + SETDEV

add("late-accelerate-config-more-procs", "more-ranks-than-gpus",
    "the accelerate config starts more processes than the machine's 2 GPUs: set num_processes to 2",
    "lich99/ChatGLM-finetune-LoRA#16", "launch", "accelerate",
    ["$ accelerate launch --config_file config/default_config.yaml train_new.py"]
    + torchrun({r: tb([("/home/searchgpt/yq/ChatGLM-finetune-LoRA/train_new.py", 38, "<module>",
                        "accelerator = Accelerator(mixed_precision=mixed_precision, gradient_accumulation_steps=accumulate_step, deepspeed_plugin=deepspeed_plugin)")]
                      + ACC_STATE, ORDINAL_NEW.rstrip()) for r in (2, 3)},
               2, 1, fmt="old", launcher="accelerate", script="train_new.py", others=((3, 1), (0, -15), (1, -15))))

add("late-accelerate-textbox-ordinal", "more-ranks-than-gpus",
    "accelerate config asked for more GPUs than exist: rerun accelerate config with the real GPU count",
    "RUCAIBox/TextBox#343", "launch", "accelerate",
    ["$ accelerate launch run_textbox.py --model=T5 --model_path=Langboat/mengzi-t5-base --dataset=lcsts"]
    + tb([("run_textbox.py", 17, "<module>", "run_textbox(model=args.model, dataset=args.dataset, config_file_list=args.config_files, config_dict={})"),
          ("/hy-tmp/TextBox/textbox/quick_start/experiment.py", 46, "__init__", "self.accelerator = Accelerator(")]
         + ACC_STATE, "RuntimeError: CUDA error: invalid device ordinal"))

add("late-lightning-rank0-only-checkpoint", "nccl-watchdog-timeout",
    "trainer.save_checkpoint() (a collective: it ends in a barrier) was called under if trainer.is_global_zero, so "
    "rank 0 waited in a barrier the others never entered: call it on every rank",
    "alan-turing-institute/autocast#381", "timeout", "slurm+lightning",
    slurm([(None, "`Trainer.fit` stopped: `max_epochs=40` reached."),
           (None, "[rank0]:[E521 14:02:33.118201201 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation "
                  "timeout: WorkNCCL(SeqNum=41822, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
                  "1800090 milliseconds before timing out."),
           (None, "[rank0]:[E521 14:02:33.118902231 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank 0]  "
                  "failure detected by watchdog at work sequence id: 41822 PG status: last enqueued work: 41822, last completed work: 41821"),
           (None, "[rank0]:[E521 14:02:33.118912402 ProcessGroupNCCL.cpp:670] [Rank 0] Some NCCL operations have failed or "
                  "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.")],
          fails=((0, "Aborted (core dumped)"),), node="gpu-h100-03"),
    alt=("collective-mismatch",))

add("late-accelerate-long-file-scan", "slow-rank-timeout",
    "indexing a 200 GB file took 1.5 h on one rank, past the 30 min default: raise timeout= in "
    "init_process_group to cover it (5400 s worked)",
    "huggingface/accelerate#314", "timeout", "torchrun",
    ["<class 'data.read_data.LineShuffler'>: Init /vc_data/users/trigger_model_data/0711-0814/NegativeTrain",
     " 35%|████      | 73811210851/208140108456 [30:01<57:14, 39115047.81MB/s]",
     "[E ProcessGroupNCCL.cpp:485] [Rank 6] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, "
     "Timeout(ms)=1800000) ran for 1802246 milliseconds before timing out."] + TAKEDOWN
    + torchrun({}, 6, -6, fmt="old", others=((0, -15),), script="train.py"),
    related=("nccl-watchdog-timeout", "killed-by-signal"))

add("late-dataparallel-ncclshmopen-segv", "shm-too-small",
    "run the container with more shared memory (--shm-size=2g); NCCL segfaulted in ncclShmOpen with the default 64 MB",
    "pytorch/tutorials#2475", "memory", "python",
    ["$ python beginner_source/blitz/data_parallel_tutorial.py", "Let's use 2 GPUs!",
     "Fatal Python error: Segmentation fault", "",
     "Thread 0x00007f6b5e7ae640 (most recent call first):",
     "  File \"/opt/conda/lib/python3.10/site-packages/torch/nn/parallel/comm.py\", line 67, in broadcast_coalesced",
     "Segmentation fault (core dumped)",
     "(gdb) bt", "#0  0x00007f6b59544f3b in ncclShmOpen(char*, unsigned long, void**, void**, int, void**) () from /opt/conda/lib/python3.10/site-packages/torch/lib/libtorch_cuda.so"])

add("late-docker-nccl-segment", "shm-too-small",
    "add --shm-size=1g to docker run",
    "fal-ai-community/video-diffusion-speedrun#2", "memory", "torchrun",
    torchrun({0: ["c41f2e0a7b21:312:331 [0] misc/shmutils.cc:72 NCCL WARN Error: failed to extend /dev/shm/nccl-pZafXL to 7340388 bytes",
                  "c41f2e0a7b21:312:331 [0] misc/shmutils.cc:113 NCCL WARN " + SHM_NCCL.format(s="pZafXL", n=7340384)]
              + tb([U(44, "main", "dist.barrier()", "train.py")],
                   nccl_exc("system", SHM_NCCL.format(s="pZafXL", n=7340384), ver="2.21.5",
                            where="/pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:317"))},
             0, 1, others=((1, -15),)),
    alt=("nccl-system-error",))

add("late-llama2-torchrun-9", "host-oom",
    "loading the 7B checkpoint needs more RAM than the machine has: add memory/swap",
    "meta-llama/llama#706", "memory", "torchrun",
    ["$ torchrun --nproc_per_node 1 example_chat_completion.py --ckpt_dir llama-2-7b-chat/ --tokenizer_path tokenizer.model",
     "> initializing model parallel with size 1", "> initializing ddp with size 1", "> initializing pipeline with size 1"]
    + torchrun({}, 0, -9, fmt="old", script="example_chat_completion.py", python="/home/akemid/llama/venv/bin/python3"),
    alt=("killed-by-signal",))

add("late-windows-modelscope-nccl", "nccl-not-built",
    "Windows has no NCCL: run the distributed code under WSL (Linux) or use gloo",
    "modelscope/modelscope#334", "version", "torchrun",
    torchrun({0: tb([("D:\\work\\modelscope\\examples\\finetune.py", 52, "<module>", "trainer.train()"),
                     ("D:\\conda\\envs\\ms\\lib\\site-packages\\modelscope\\utils\\torch_utils.py", 84, "_init_dist_pytorch",
                      "dist.init_process_group(backend=backend, **kwargs)")],
                    "RuntimeError: Distributed package doesn't have NCCL built in")},
             0, 1, fmt="mid", prefix=False, script="finetune.py", python="D:\\conda\\envs\\ms\\python.exe"))

add("late-deprecated-dist-module", "torch-api-mismatch",
    "torch.distributed.deprecated no longer exists in newer PyTorch: change the call to torch.distributed.is_initialized()",
    "MhLiao/MaskTextSpotter#55", "version", "launch",
    launch_legacy({0: tb([("tools/train_net.py", 171, "<module>", "main()"),
                          ("maskrcnn_benchmark/utils/comm.py", 14, "get_world_size", "if not torch.distributed.deprecated.is_initialized():")],
                         "AttributeError: module 'torch.distributed' has no attribute 'deprecated'")},
                  0, 1, ["tools/train_net.py", "--config-file", "configs/finetune.yaml"]))

add("late-multinode-example-master-addr", "rendezvous-unreachable",
    "MASTER_ADDR=192.168.0.1 was copied from the example: set it to node 0's real address on both nodes",
    "hiyouga/LlamaFactory#5864", "network", "torchrun",
    ["FORCE_TORCHRUN=1 NNODES=2 RANK=1 MASTER_ADDR=192.168.0.1 MASTER_PORT=29500 llamafactory-cli train examples/train_lora/llama3_lora_sft.yaml",
     "[W1030 10:21:45.130942312 socket.cpp:697] [c10d] The client socket has failed to connect to 192.168.0.1:29500 (errno: 110 - Connection timed out)."]
    + tb([("/opt/conda/bin/torchrun", 33, "<module>", "sys.exit(load_entry_point('torch==2.3.1', 'console_scripts', 'torchrun')())"),
          ("torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py", 55, "next_rendezvous", "self._store = TCPStore(  # type: ignore[call-arg]")],
         "torch.distributed.DistNetworkError: The client socket has timed out after 900s while trying to connect to (192.168.0.1, 29500).",
         site=CONDA))

add("late-gloo-mesh-no-error", "gloo-connect-full-mesh",
    "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface the workers share, in the worker environment",
    "gpustack/gpustack#2125", "network", "ray",
    ["(RayWorkerWrapper pid=2211, ip=10.0.0.12) INFO 05-30 08:11:02 parallel_state.py:951] world_size=2 rank=1",
     "(RayWorkerWrapper pid=2211, ip=10.0.0.12) ERROR RuntimeError: Gloo connectFullMesh failed with "
     "[../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error"])

add("late-nccl-init-sigbus-mpirun", "shm-too-small",
    "the container's /dev/shm is too small for NCCL's shared memory: --shm-size (or --ipc=host)",
    "NVIDIA/nccl#983", "memory", "mpirun",
    ["4c217144f0b1:113168:113179 [0] NCCL INFO Channel 01/0 : 0[1a000] -> 1[1a000] [send] via NET/IB/2",
     "[4c217144f0b1:113168] *** Process received signal ***",
     "[4c217144f0b1:113168] Signal: Bus error (7)", "[4c217144f0b1:113168] Signal code: Non-existant physical address (2)",
     "--------------------------------------------------------------------------",
     "Primary job  terminated normally, but 1 process returned", "a non-zero exit code. Per user-direction, the job has been aborted.",
     "--------------------------------------------------------------------------"],
    alt=("killed-by-signal",))

# --------------------------------------------------------------------------------------------

COLUMNS = ("id", "file", "expect", "alt", "related", "heldout", "kind", "launcher", "source", "fix")


def heldout(n: int) -> str:
    """'yes' for the held-out fifth (every fifth case by position, ids 5, 10, 15, ..., fixed before any
    pattern), 'late' for the cases written after the catalogue was frozen, else 'no'."""
    if n >= LATE_FROM:
        return "late"
    return "yes" if n % 5 == 0 else "no"


def main() -> None:
    cases_dir = os.path.join(HERE, "cases")
    os.makedirs(cases_dir, exist_ok=True)
    for name in os.listdir(cases_dir):
        if name.endswith(".log"):
            os.remove(os.path.join(cases_dir, name))
    slugs = [c["slug"] for c in CASES]
    assert len(slugs) == len(set(slugs)), "duplicate slug"
    rows = ["\t".join(COLUMNS)]
    for n, case in enumerate(CASES, start=1):
        fname = f"{n:03d}-{case['slug']}.log"
        with open(os.path.join(cases_dir, fname), "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(case["log"]) + "\n")
        row = dict(case, id=f"{n:03d}", file=fname, heldout=heldout(n))
        for k in COLUMNS:
            assert "\t" not in str(row[k]) and "\n" not in str(row[k]), (fname, k)
        rows.append("\t".join(str(row[k]) for k in COLUMNS))
    with open(os.path.join(HERE, "cases.tsv"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(rows) + "\n")
    print(f"wrote {len(CASES)} cases")


if __name__ == "__main__":
    main()
