"""Stable-Baselines3 PPO at the hyper-parameters of a scalebox_ms PPO config, for the side-by-side benchmarks.

``sb3_ppo(cfg, seed)`` builds SB3's vector env (``VecNormalize`` when the config normalises observations or
rewards, as rl-zoo3's ``normalize: true`` does) and its ``PPO`` with the same rollout, loss, optimiser,
schedule and network settings. What SB3 has and scalebox_ms does not (gSDE) is not used, so both train the same
algorithm. ``sb3_eval_env(cfg, train_env, seed)`` is an evaluation env that normalises observations with the
training statistics and reports raw rewards.
"""
from __future__ import annotations


def _schedule(value: float, kind: str):
    return (lambda progress_remaining: progress_remaining * value) if kind == "linear" else value


def sb3_ppo(cfg, seed: int):
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    e, p, pol = cfg.env, cfg.ppo, cfg.policy
    env = make_vec_env(e.id, n_envs=e.num_envs, seed=seed, env_kwargs=e.kwargs or None)
    if e.normalize_obs or e.normalize_reward:
        env = VecNormalize(env, norm_obs=e.normalize_obs, norm_reward=e.normalize_reward, clip_obs=e.clip_obs,
                           clip_reward=e.clip_reward, gamma=p.gamma)
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[pol.activation]
    model = PPO("MlpPolicy", env, n_steps=p.n_steps, batch_size=p.batch_size, n_epochs=p.n_epochs, gamma=p.gamma,
                gae_lambda=p.gae_lambda, learning_rate=_schedule(p.learning_rate, p.lr_schedule),
                clip_range=_schedule(p.clip_range, p.clip_schedule), clip_range_vf=p.clip_range_vf,
                ent_coef=p.ent_coef, vf_coef=p.vf_coef, max_grad_norm=p.max_grad_norm, target_kl=p.target_kl,
                normalize_advantage=p.normalize_advantage, seed=seed, device="cpu", verbose=0,
                policy_kwargs=dict(log_std_init=pol.log_std_init, ortho_init=pol.ortho_init, activation_fn=activation,
                                   net_arch=dict(pi=list(pol.pi_layers), vf=list(pol.vf_layers))))
    return model, env


def sb3_eval_env(cfg, train_env, seed: int, n_envs: int = 1):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = make_vec_env(cfg.env.id, n_envs=n_envs, seed=seed, env_kwargs=cfg.env.kwargs or None)
    if isinstance(train_env, VecNormalize):
        env = VecNormalize(env, training=False, norm_obs=train_env.norm_obs, norm_reward=False,
                           clip_obs=train_env.clip_obs)
        env.obs_rms = train_env.obs_rms
    return env


def sb3_episode_curve(curve: list, start: float):
    """An SB3 callback appending (env step, seconds since ``start``, raw return) to ``curve`` for every finished
    training episode (SB3's ``Monitor`` info)."""
    import time

    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeCurve(BaseCallback):
        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:
                    curve.append((int(self.num_timesteps), time.perf_counter() - start, float(info["episode"]["r"])))
            return True

    return EpisodeCurve()
