"""The embedded default benchmark (``oodeval demo``): offline data, a small trained convnet,
and the normal extract -> detectors -> metrics -> report path run on them."""
