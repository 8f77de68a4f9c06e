from setuptools import find_packages, setup

setup(
    name="scalebox_ms",
    version="0.2.0",
    description="MindSpore-native reinforcement learning: PPO compiled into MindSpore graphs",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["scalebox_ms", "scalebox_ms.*"]),
    package_data={"scalebox_ms": ["configs/*.yaml", "ops/custom/*.cc", "ops/custom/*.h"]},
    python_requires=">=3.9,<3.12",
    install_requires=[
        "mindspore==2.10.0",
        "numpy>=1.26,<2",  # the mindspore 2.10 wheel is built against numpy 1.x
        "gymnasium>=1.0,<2",
        "pyyaml>=6",
        "tqdm>=4.60",
        "matplotlib>=3.7",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-benchmark>=4"],
        "bench": ["torch==2.13.0", "stable-baselines3==2.9.*", "psutil>=5"],
        "mujoco": ["gymnasium[mujoco]>=1.0,<2"],
    },
    entry_points={"console_scripts": [
        "scalebox-train=scalebox_ms.train:main",
        "scalebox-evaluate=scalebox_ms.evaluate:main",
    ]},
)
