#!/usr/bin/env python3
"""Golden data for Ember's optimizers and learning-rate schedules, from PyTorch.

Run:  python scripts/golden_optim.py [out]   (default tests/data/golden_optim.safetensors)
      needs torch (>= 2.2: every optimizer's maximize and decoupled_weight_decay) and
      safetensors from PyPI, e.g. python3 -m venv /tmp/v && /tmp/v/bin/pip install torch safetensors
The output's tensors and metadata are deterministic (the header's metadata order is not, so
the bytes may differ between runs) and committed; tests/test_optim_parity.c replays it.

Everything is float64 (torch.set_default_dtype), so that PyTorch's own scalar state (step,
NAdam's mu_product) is float64 too and the test can ask for agreement to ~1e-12.

Optimizer cases "opt/<case>" (metadata "opt/<case>": "kind=<optimizer> <option>=<value> ..."
with PyTorch's option names; booleans 0/1, betas as beta1/beta2): two parameters, p0 [3, 4]
and p1 [5], start from "opt/<case>/p<k>/init"; step t = 1..10 sets p<k>.grad to
"opt/<case>/p<k>/grad<t>" and calls optimizer.step() (foreach=False: the single-tensor
formulas); after it, "opt/<case>/p<k>/after<t>" is the parameter and
"opt/<case>/p<k>/after<t>/<state>" each entry of optimizer.state[p<k>] (tensors of the
parameter's shape; the scalar ones, step and mu_product, as shape [1]).

Schedule cases "sched/<case>" (metadata "sched/<case>": "kind=<schedule> base_lr=<lr>
optimizer=<sgd|adam> <option>=<value> ...", milestones as m0, m1, ...): the scheduler is made
on the optimizer (SGD with momentum 0.9, or Adam) and stepped 50 times after
optimizer.step(); "sched/<case>/lr" [51] is get_last_lr()[0] after construction and after
each step, "sched/<case>/momentum" [51] the optimizer's momentum (beta1 for Adam) for
OneCycleLR, "sched/<case>/metrics" [50] the values ReduceLROnPlateau is stepped with. The
script also checks that PyTorch's own resume (state_dict()/load_state_dict() after step 17)
reproduces the uninterrupted rates, which is what the test asks of Ember.
"""
import math
import sys

import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)
torch.manual_seed(31)
tensors, meta = {}, {}
STEPS = 10
SCHED_STEPS = 50
RESUME_AT = 17


def put(name, t):
    tensors[name] = t.detach().clone().contiguous()


def meta_string(kind, opts):
    parts = ["kind=" + kind]
    for k, v in opts.items():
        if isinstance(v, bool):
            v = int(v)
        if k == "betas":
            parts += ["beta1=%r" % v[0], "beta2=%r" % v[1]]
        elif k == "milestones":
            parts += ["m%d=%d" % (i, m) for i, m in enumerate(v)]
        else:
            parts.append("%s=%r" % (k, v))
    return " ".join(parts)


OPTIMIZERS = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
    "adadelta": torch.optim.Adadelta, "adagrad": torch.optim.Adagrad, "rmsprop": torch.optim.RMSprop,
    "adamax": torch.optim.Adamax, "nadam": torch.optim.NAdam, "radam": torch.optim.RAdam,
}

OPT_CASES = [
    ("sgd", "sgd", dict(lr=0.1)),
    ("sgd_momentum_wd", "sgd", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("sgd_dampening_maximize", "sgd", dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1, maximize=True)),
    ("sgd_nesterov", "sgd", dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", "adam", dict(lr=1e-2)),
    ("adam_amsgrad_wd", "adam", dict(lr=3e-3, weight_decay=0.05, amsgrad=True)),
    ("adam_maximize", "adam", dict(lr=1e-2, betas=(0.5, 0.9), eps=1e-3, maximize=True)),
    ("adamw", "adamw", dict(lr=1e-2)),
    ("adamw_amsgrad_maximize", "adamw", dict(lr=5e-3, weight_decay=0.1, amsgrad=True, maximize=True)),
    ("adadelta", "adadelta", dict()),
    ("adadelta_wd", "adadelta", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1)),
    ("adadelta_maximize", "adadelta", dict(weight_decay=0.05, maximize=True)),
    ("adagrad", "adagrad", dict()),
    ("adagrad_decay_init", "adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.2,
                                           eps=1e-6)),
    ("adagrad_maximize", "adagrad", dict(maximize=True)),
    ("rmsprop", "rmsprop", dict()),
    ("rmsprop_momentum", "rmsprop", dict(momentum=0.9)),
    ("rmsprop_centered", "rmsprop", dict(centered=True)),
    ("rmsprop_centered_momentum_wd", "rmsprop", dict(lr=5e-3, centered=True, momentum=0.5, weight_decay=0.1)),
    ("rmsprop_small_alpha_maximize", "rmsprop", dict(alpha=0.3, centered=True, maximize=True)),
    ("adamax", "adamax", dict()),
    ("adamax_wd_small_beta1", "adamax", dict(weight_decay=0.1, betas=(0.3, 0.9))),
    ("adamax_maximize", "adamax", dict(eps=1e-3, maximize=True)),
    ("nadam", "nadam", dict()),
    ("nadam_wd", "nadam", dict(weight_decay=0.1)),
    ("nadam_decoupled", "nadam", dict(weight_decay=0.1, decoupled_weight_decay=True)),
    ("nadam_decay_maximize", "nadam", dict(momentum_decay=0.01, betas=(0.4, 0.95), maximize=True)),
    ("radam", "radam", dict()),
    ("radam_wd", "radam", dict(weight_decay=0.1)),
    ("radam_decoupled", "radam", dict(weight_decay=0.1, decoupled_weight_decay=True, betas=(0.9, 0.9))),
    ("radam_maximize_small_beta1", "radam", dict(betas=(0.3, 0.99), maximize=True)),
]


def optimizer_case(name, kind, opts):
    case = "opt/" + name
    meta[case] = meta_string(kind, opts)
    params = [torch.randn(3, 4), torch.randn(5)]
    for k, p in enumerate(params):
        put("%s/p%d/init" % (case, k), p)
    params = [p.clone().requires_grad_() for p in params]
    opt = OPTIMIZERS[kind](params, foreach=False, **opts)
    for t in range(1, STEPS + 1):
        scale = 1e-3 if t == 3 else 1.0   # a small step: eps matters
        for k, p in enumerate(params):
            g = torch.randn(p.shape) * scale
            put("%s/p%d/grad%d" % (case, k, t), g)
            p.grad = g.clone()
        opt.step()
        for k, p in enumerate(params):
            put("%s/p%d/after%d" % (case, k, t), p)
            for sname, s in opt.state[p].items():
                if s is None:
                    continue
                s = s if torch.is_tensor(s) else torch.tensor(float(s))
                put("%s/p%d/after%d/%s" % (case, k, t, sname), s.reshape(p.shape) if s.dim() else s.reshape(1))


def metrics_for(name):
    if name == "plateau":      # falls, then flattens with a small wobble
        return [1.0 / (1 + 0.3 * t) if t < 12 else 0.22 + 0.004 * math.sin(t) for t in range(SCHED_STEPS)]
    return [math.sqrt(t) if t < 15 else 3.8 + 0.02 * math.cos(t) for t in range(SCHED_STEPS)]  # rises, then flat


SCHED_CASES = [
    ("step", "sgd", 0.1, lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),
     "step", dict(step_size=7, gamma=0.5)),
    ("multistep", "sgd", 0.1, lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[5, 12, 12, 30], gamma=0.3),
     "multistep", dict(milestones=[5, 12, 12, 30], gamma=0.3)),
    ("exponential", "sgd", 0.1, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.93),
     "exponential", dict(gamma=0.93)),
    ("cosine", "sgd", 0.1, lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=20, eta_min=0.001),
     "cosine_annealing", dict(T_max=20, eta_min=0.001)),
    ("warm_restarts", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=8, T_mult=2, eta_min=1e-4),
     "cosine_warm_restarts", dict(T_0=8, T_mult=2, eta_min=1e-4)),
    ("warm_restarts_mult1", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=6),
     "cosine_warm_restarts", dict(T_0=6, T_mult=1, eta_min=0.0)),
    ("one_cycle", "sgd", 0.1, lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=50),
     "one_cycle", dict(max_lr=0.5, total_steps=50)),
    ("one_cycle_linear_three_phase_adam", "adam", 0.001,
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.01, total_steps=60, pct_start=0.25,
                                                   anneal_strategy="linear", three_phase=True, div_factor=10.0,
                                                   final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9),
     "one_cycle", dict(max_lr=0.01, total_steps=60, pct_start=0.25, anneal_linear=True, three_phase=True,
                       div_factor=10.0, final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9)),
    ("linear_warmup", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=10),
     "linear", dict(start_factor=0.25, end_factor=1.0, total_iters=10)),
    ("linear_decay", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=30),
     "linear", dict(start_factor=1.0, end_factor=0.1, total_iters=30)),
    ("plateau", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5, patience=3, threshold=1e-2, cooldown=2,
                                                          min_lr=1e-3),
     "plateau", dict(factor=0.5, patience=3, threshold=1e-2, cooldown=2, min_lr=1e-3)),
    ("plateau_max_abs", "sgd", 0.1,
     lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, mode="max", factor=0.3, patience=2, threshold=0.05,
                                                          threshold_mode="abs", eps=1e-6),
     "plateau", dict(mode_max=True, factor=0.3, patience=2, threshold=0.05, threshold_abs=True, eps=1e-6)),
]


def make_optimizer(kind, lr):
    p = [torch.zeros(2, requires_grad=True)]
    return torch.optim.SGD(p, lr=lr, momentum=0.9) if kind == "sgd" else torch.optim.Adam(p, lr=lr)


def momentum_of(opt):
    g = opt.param_groups[0]
    return g["betas"][0] if "betas" in g else g["momentum"]


def run_schedule(opt, sched, metrics, start, stop, lrs, moms):
    for t in range(start, stop):
        opt.step()
        if metrics is None:
            sched.step()
        else:
            sched.step(metrics[t])
        lrs.append(sched.get_last_lr()[0])
        moms.append(momentum_of(opt))


def schedule_case(name, okind, base_lr, make, kind, opts):
    case = "sched/" + name
    meta[case] = meta_string(kind, dict(base_lr=base_lr, optimizer=okind, **opts)).replace("optimizer='%s'" % okind,
                                                                                           "optimizer=" + okind)
    metrics = metrics_for(name) if kind == "plateau" else None
    opt = make_optimizer(okind, base_lr)
    sched = make(opt)
    lrs, moms = [sched.get_last_lr()[0]], [momentum_of(opt)]
    run_schedule(opt, sched, metrics, 0, SCHED_STEPS, lrs, moms)
    put(case + "/lr", torch.tensor(lrs))
    if kind == "one_cycle":
        put(case + "/momentum", torch.tensor(moms))
    if metrics is not None:
        put(case + "/metrics", torch.tensor(metrics))
    # PyTorch's resume at RESUME_AT through state dicts gives the same rates
    opt = make_optimizer(okind, base_lr)
    sched = make(opt)
    lrs2, moms2 = [sched.get_last_lr()[0]], [momentum_of(opt)]
    run_schedule(opt, sched, metrics, 0, RESUME_AT, lrs2, moms2)
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    opt = make_optimizer(okind, base_lr)
    sched = make(opt)
    opt.load_state_dict(saved_opt)
    sched.load_state_dict(saved_sched)
    run_schedule(opt, sched, metrics, RESUME_AT, SCHED_STEPS, lrs2, moms2)
    assert lrs2 == lrs, (name, lrs2, lrs)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden_optim.safetensors"
    for name, kind, opts in OPT_CASES:
        optimizer_case(name, kind, opts)
    for case in SCHED_CASES:
        schedule_case(*case)
    meta["torch"] = torch.__version__
    save_file(tensors, out, metadata=meta)
    print("wrote %d tensors, %d cases to %s" % (len(tensors), len(OPT_CASES) + len(SCHED_CASES), out))


if __name__ == "__main__":
    main()
