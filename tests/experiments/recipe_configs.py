"""What a run of each training recipe records as its ``config.gin``, for the tests of the
recipes and of which runs a method fits."""


def trained_config(gin_file):
  """The config.gin a run of ``gin_file`` (under gin_configs/) records (gin.config_str)."""
  import gin

  from meshbayes import configurables  # noqa: F401  (registers the configurables)
  from meshbayes.gin_configs import DIRECTORY as GIN_CONFIGS

  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_CONFIGS))
  gin.parse_config_files_and_bindings([str(GIN_CONFIGS / gin_file)],
                                      ["MODEL_DIR = 'x'", "TRAIN_STEPS = 1"], skip_unknown=True)
  config = gin.config_str()
  gin.clear_config()
  return config
