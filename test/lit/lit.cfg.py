# lit configuration for sdc's FileCheck tests.
import os
import lit.formats

config.name = "sdc"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".onnxtxt"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.sd_build_dir, "test", "lit")
config.excludes = ["lit.cfg.py", "lit.site.cfg.py.in", "Inputs"]
config.environment["PATH"] = os.pathsep.join(
    [os.path.join(config.sd_build_dir, "tools"), config.llvm_tools_dir, config.environment.get("PATH", "")])
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
