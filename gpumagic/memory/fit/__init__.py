"""``%%memfit`` core: will a cell fit on a GPU, predicted by a dry run on fake tensors."""
