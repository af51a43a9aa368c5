"""Operations on tensors. Each module turns Tensors into kernel launches and back into Tensors; none of
them knows about autograd (the rules in netcl.autograd do)."""
