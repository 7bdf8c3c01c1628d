"""The package version, in a module of its own: a core can read it without importing the
package root, whose ``load_ipython_extension`` reaches the IPython glue (issue 8)."""

__version__ = "0.1.0"
