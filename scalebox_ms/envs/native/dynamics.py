"""Batched dynamics of gymnasium's classic-control envs as MindSpore graph ops (float32).

Each class mirrors one gymnasium env exactly (same constants, integrator and order of operations; RK4 for
Acrobot, semi-implicit updates where gymnasium uses them) for a batch of states of shape (N, state_dim):

* ``initial_state(u)`` maps uniform [0, 1) noise (N, noise_dim) to gymnasium's reset distribution;
* ``step(state, action)`` -> (next_state, reward, terminated);
* ``observe(state)`` -> observation;
* ``terminal(obs)`` -> whether a (numpy, (N, obs_dim)) observation is a terminal one: the termination rule above on
  the observation, for backends that lose the flag (EnvPool reports an episode that ends on its last allowed step
  as truncated only, where gymnasium's TimeLimit keeps ``terminated``).

Differences to gymnasium: arithmetic in float32 (gymnasium's CartPole, MountainCar, Acrobot and Pendulum keep
float64 states), so a free-running trajectory drifts from gymnasium's after many steps (the systems are
chaotic); per step, from the same state, observations agree to ~1e-6 and flags agree (teacher-forced test in
tests/test_native_envs.py), except Acrobot near its velocity limits, where a float32 RK4 step differs from the
float64 one by up to ~3e-3 (numpy in float32 shows the same difference). Reset states are drawn from scalebox_ms's own RNG, not gymnasium's.
"""
from __future__ import annotations

import math

import mindspore as ms
import numpy as np
from mindspore import ops

PI = math.pi


def _f32(x):
    return x.astype(ms.float32)


def _columns(x):
    """The columns of an (N, k) batch as k tensors of shape (N,): one Unstack kernel. (A column slice ``x[:, i]``
    is one StridedSlice kernel each, which MindSpore 2.10's CPU backend runs ~4x slower per column: CartPole's
    four took ~0.9 ms per step at 4096 envs, the unstack ~0.25 ms. Same values, bit for bit.)"""
    return ops.unstack(x, axis=1)


class CartPole:
    env_id = "CartPole-v1"
    state_dim, noise_dim, max_steps = 4, 4, 500
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masspole + masscart
    polemass_length = masspole * length
    x_threshold = 2.4
    theta_threshold = 12 * 2 * math.pi / 360

    @staticmethod
    def initial_state(u):
        return -0.05 + 0.1 * u

    def step(self, s, action):
        x, x_dot, theta, theta_dot = _columns(s)
        force = (_f32(action) * 2.0 - 1.0) * self.force_mag
        costheta, sintheta = ops.cos(theta), ops.sin(theta)
        temp = (force + self.polemass_length * theta_dot * theta_dot * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta * costheta / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot  # explicit Euler, as gymnasium's default "euler" integrator
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        ns = ops.stack([x, x_dot, theta, theta_dot], axis=1)
        terminated = (x < -self.x_threshold) | (x > self.x_threshold) | \
                     (theta < -self.theta_threshold) | (theta > self.theta_threshold)
        return ns, ops.ones_like(x), terminated

    @staticmethod
    def observe(s):
        return s

    def terminal(self, obs):
        x, theta = obs[:, 0], obs[:, 2]
        return (x < -self.x_threshold) | (x > self.x_threshold) | (theta < -self.theta_threshold) | \
            (theta > self.theta_threshold)


class MountainCar:
    env_id = "MountainCar-v0"
    state_dim, noise_dim, max_steps = 2, 1, 200
    min_position, max_position, max_speed, goal_position, goal_velocity = -1.2, 0.6, 0.07, 0.5, 0.0
    force, gravity = 0.001, 0.0025

    @staticmethod
    def initial_state(u):
        return ops.concat([-0.6 + 0.2 * u, ops.zeros_like(u)], axis=1)

    def step(self, s, action):
        position, velocity = _columns(s)
        velocity = velocity + (_f32(action) - 1.0) * self.force + ops.cos(3 * position) * (-self.gravity)
        velocity = ops.clip_by_value(velocity, -self.max_speed, self.max_speed)
        position = ops.clip_by_value(position + velocity, self.min_position, self.max_position)
        velocity = ops.where((position == self.min_position) & (velocity < 0), ops.zeros_like(velocity), velocity)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return ops.stack([position, velocity], axis=1), -ops.ones_like(position), terminated

    @staticmethod
    def observe(s):
        return s

    def terminal(self, obs):
        return (obs[:, 0] >= self.goal_position) & (obs[:, 1] >= self.goal_velocity)


class MountainCarContinuous(MountainCar):
    env_id = "MountainCarContinuous-v0"
    max_steps = 999
    goal_position, power = 0.45, 0.0015

    def step(self, s, action):
        position, velocity = _columns(s)
        a = action.reshape(-1)  # (N, 1) -> (N,): no copy
        force = ops.clip_by_value(a, -1.0, 1.0)
        velocity = velocity + force * self.power - 0.0025 * ops.cos(3 * position)
        velocity = ops.clip_by_value(velocity, -self.max_speed, self.max_speed)
        position = ops.clip_by_value(position + velocity, self.min_position, self.max_position)
        velocity = ops.where((position == self.min_position) & (velocity < 0), ops.zeros_like(velocity), velocity)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        reward = ops.where(terminated, ops.full_like(position, 100.0), ops.zeros_like(position)) - a * a * 0.1
        return ops.stack([position, velocity], axis=1), reward, terminated


class Pendulum:
    env_id = "Pendulum-v1"
    state_dim, noise_dim, max_steps = 2, 2, 200
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    @staticmethod
    def initial_state(u):
        u0, u1 = _columns(u)
        return ops.stack([PI * (2 * u0 - 1), 2 * u1 - 1], axis=1)

    def step(self, s, action):
        th, thdot = _columns(s)
        u = ops.clip_by_value(action.reshape(-1), -self.max_torque, self.max_torque)
        norm_th = ops.remainder(th + PI, 2 * PI) - PI
        costs = norm_th * norm_th + 0.1 * thdot * thdot + 0.001 * u * u
        newthdot = thdot + (3 * self.g / (2 * self.l) * ops.sin(th) + 3.0 / (self.m * self.l ** 2) * u) * self.dt
        newthdot = ops.clip_by_value(newthdot, -self.max_speed, self.max_speed)
        newth = th + newthdot * self.dt
        return ops.stack([newth, newthdot], axis=1), -costs, ops.zeros_like(th).astype(ms.bool_)

    @staticmethod
    def observe(s):
        th, thdot = _columns(s)
        return ops.stack([ops.cos(th), ops.sin(th), thdot], axis=1)

    @staticmethod
    def terminal(obs):
        return np.zeros(len(obs), bool)  # (Pendulum never terminates)


class Acrobot:
    env_id = "Acrobot-v1"
    state_dim, noise_dim, max_steps = 4, 4, 500
    dt = 0.2
    m1 = m2 = 1.0
    l1 = 1.0
    lc1 = lc2 = 0.5
    I1 = I2 = 1.0
    g = 9.8
    max_vel_1, max_vel_2 = 4 * PI, 9 * PI

    @staticmethod
    def initial_state(u):
        return -0.1 + 0.2 * u

    def _dsdt(self, s, a):  # gymnasium's "book" dynamics
        m1, m2, l1, lc1, lc2, I1, I2, g = self.m1, self.m2, self.l1, self.lc1, self.lc2, self.I1, self.I2, self.g
        theta1, theta2, dtheta1, dtheta2 = _columns(s)
        d1 = m1 * lc1 ** 2 + m2 * (l1 ** 2 + lc2 ** 2 + 2 * l1 * lc2 * ops.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2 ** 2 + l1 * lc2 * ops.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * ops.cos(theta1 + theta2 - PI / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2 * dtheta2 * ops.sin(theta2)
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * ops.sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * ops.cos(theta1 - PI / 2) + phi2)
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1 * dtheta1 * ops.sin(theta2) - phi2) / (
            m2 * lc2 ** 2 + I2 - d2 * d2 / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return ops.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], axis=1)

    def step(self, s, action):
        torque = _f32(action) - 1.0  # AVAIL_TORQUE = [-1, 0, +1]
        dt, dt2 = self.dt, self.dt / 2.0
        k1 = self._dsdt(s, torque)  # one RK4 step over [0, dt], as gymnasium's rk4(..., [0, dt])
        k2 = self._dsdt(s + dt2 * k1, torque)
        k3 = self._dsdt(s + dt2 * k2, torque)
        k4 = self._dsdt(s + dt * k3, torque)
        ns = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        th1, th2, d1, d2 = _columns(ns)
        th1 = ops.where(th1 > PI, th1 - 2 * PI, ops.where(th1 < -PI, th1 + 2 * PI, th1))  # wrap(., -pi, pi)
        th2 = ops.where(th2 > PI, th2 - 2 * PI, ops.where(th2 < -PI, th2 + 2 * PI, th2))
        d1 = ops.clip_by_value(d1, -self.max_vel_1, self.max_vel_1)
        d2 = ops.clip_by_value(d2, -self.max_vel_2, self.max_vel_2)
        ns = ops.stack([th1, th2, d1, d2], axis=1)
        terminated = -ops.cos(th1) - ops.cos(th2 + th1) > 1.0
        reward = ops.where(terminated, ops.zeros_like(th1), -ops.ones_like(th1))
        return ns, reward, terminated

    @staticmethod
    def observe(s):
        th1, th2, d1, d2 = _columns(s)
        return ops.stack([ops.cos(th1), ops.sin(th1), ops.cos(th2), ops.sin(th2), d1, d2], axis=1)

    @staticmethod
    def terminal(obs):
        c1, s1, c2, s2 = obs[:, 0], obs[:, 1], obs[:, 2], obs[:, 3]
        return -c1 - (c1 * c2 - s1 * s2) > 1.0  # -cos(th1) - cos(th2 + th1) > 1


DYNAMICS = {cls.env_id: cls for cls in (CartPole, MountainCar, MountainCarContinuous, Pendulum, Acrobot)}
