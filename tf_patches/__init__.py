"""The only code in fastt that reaches into TensorFlow's (and tf_keras's) internals.

Each module here patches or wraps one private piece and stays small, so that a TensorFlow
upgrade that moves it breaks in exactly one place.
"""
