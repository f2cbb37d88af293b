"""What fastt knows about TensorFlow op types, in one place (no TensorFlow here): each set
names the ops one rule of a pass applies to."""

#: Ops that define variables (their persistent bytes are the variable's size).
VARIABLE_TYPES = frozenset({
    "AutoReloadVariable", "VarHandleOp", "Variable", "VariableV2", "_VarHandlesOp"})
#: TensorFlow's v1 while-loop machinery.
LOOP_TYPES = frozenset({
    "Enter", "Exit", "LoopCond", "NextIteration", "RefEnter", "RefExit", "RefNextIteration"})
#: The ops that close a v1 while loop (their input edge is the loop's back edge).
BACK_EDGE_TYPES = frozenset({"NextIteration", "RefNextIteration"})
#: The variables whose values the plugin reads and writes back when training moves to another
#: graph (a subset of ``VARIABLE_TYPES``).
CARRIED_VARIABLE_TYPES = frozenset({"VarHandleOp", "Variable", "VariableV2"})
#: Dataset iterators whose position the plugin carries to another graph.
ITERATOR_TYPES = frozenset({"Iterator", "IteratorV2", "OneShotIterator"})
#: Assignments: a training update only when the value comes from variables.
PLAIN_ASSIGNS = frozenset({"Assign", "AssignVariableOp"})
#: The nodes TensorFlow inserts to move a tensor between devices.
TRANSFER_TYPES = frozenset({"_HostRecv", "_HostSend", "_Recv", "_Send"})
#: The executor's bookkeeping nodes in a trace.
IGNORED_NODES = frozenset({"_SINK", "_SOURCE"})
#: Ops whose outputs share their input's buffer: they need no memory of their own.
ALIASING_TYPES = frozenset({
    "ExpandDims", "Identity", "IdentityN", "PreventGradient", "ReadVariableOp", "Reshape",
    "Snapshot", "Squeeze", "StopGradient"})
#: Ops that read or write a resource variable sparsely: from then on TensorFlow keeps the
#: variable in copy-on-read mode, where every dense read copies its buffer.
SPARSE_ACCESS_PREFIXES = ("ResourceGather", "ResourceScatter", "ResourceSparseApply")
#: Convolutions and their gradients (analytical FLOPs).
CONV_TYPES = frozenset({
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3D", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput"})
#: Matrix products (analytical FLOPs).
MATMUL_TYPES = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "MatMul"})
#: The ops fastt adds to cut and join a split op's tensors (priced as copies).
COPY_TYPES = frozenset({"AddN", "ConcatV2", "SplitV"})
#: Element-wise ops of one input (split along any axis).
UNARY = frozenset({
    "Abs", "Cast", "Ceil", "Cos", "Elu", "Erf", "Erfc", "Exp", "Expm1", "Floor", "Identity",
    "LeakyRelu", "Log", "Log1p", "LogSoftmax", "Neg", "OnesLike", "Reciprocal", "Relu",
    "Relu6", "Rint", "Round", "Rsqrt", "Selu", "Sigmoid", "Sign", "Sin", "Softmax",
    "Softplus", "Softsign", "Sqrt", "Square", "StopGradient", "Tanh", "ZerosLike"})
#: Element-wise ops of two or more inputs, broadcasting (split along any axis).
BINARY = frozenset({
    "Add", "AddN", "AddV2", "BiasAdd", "DivNoNan", "EluGrad", "Equal", "Greater",
    "GreaterEqual", "LeakyReluGrad", "Less", "LessEqual", "Maximum", "Minimum", "Mul",
    "NotEqual", "Pow", "RealDiv", "Relu6Grad", "ReluGrad", "RsqrtGrad", "Select", "SelectV2",
    "SeluGrad", "SigmoidGrad", "SoftplusGrad", "SoftsignGrad", "SqrtGrad", "SquaredDifference",
    "Sub", "TanhGrad"})
#: Reductions.
REDUCE = frozenset({"Max", "Mean", "Min", "Prod", "Sum"})
#: Pooling.
POOL = frozenset({"AvgPool", "MaxPool"})
#: Ops whose outputs are training data wherever a step reads them.
BATCH_SOURCES = frozenset({
    "EagerPyFunc", "IteratorGetNext", "IteratorGetNextSync", "Placeholder",
    "PlaceholderWithDefault", "PyFunc", "PyFuncStateless", "QueueDequeue", "QueueDequeueMany",
    "QueueDequeueManyV2", "QueueDequeueUpTo", "QueueDequeueUpToV2", "QueueDequeueV2"})
#: Ops whose outputs may be training data (synthetic inputs): the batch is looked for among
#: them, and among reads of variables the step does not train, when no source has it.
MAYBE_BATCH = frozenset({
    "Const", "RandomStandardNormal", "RandomUniform", "RandomUniformInt", "TruncatedNormal"})
#: Reads of a variable's value.
READS = frozenset({"Identity", "ReadVariableOp"})
#: Ops that read only their input's shape.
SHAPE_OPS = frozenset({"Rank", "Shape", "ShapeN", "Size"})
#: Ops whose CPU kernels declare themselves inexpensive: TensorFlow's executor runs them inline
#: on the thread that made them ready (``fastt.sched.sim.schedule.executor_order``); every other
#: kernel starts out expensive (until its measured cost, decaying from 1e8 cycles by a tenth a
#: run, falls under 8000 cycles, some ninety steps in).
INLINE_TYPES = ALIASING_TYPES | LOOP_TYPES | SHAPE_OPS | frozenset({
    "Const", "HostConst", "Merge", "NoOp", "StridedSliceGrad", "Switch", "VarHandleOp"})
#: Linear ops: applied to a sum of parts, they are applied part by part.
LINEAR = frozenset({"Add", "AddN", "AddV2", "Identity"})
#: Contractions: oneDNN fuses an epilogue into them.
CONTRACTIONS = frozenset({
    "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv2DBackpropFilter",
    "Conv2DBackpropInput", "Conv3D", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput", "MatMul"})
#: What oneDNN fuses after a contraction.
EPILOGUE = frozenset({
    "Add", "AddN", "AddV2", "BiasAdd", "Elu", "Erf", "FusedBatchNorm", "FusedBatchNormV2",
    "FusedBatchNormV3", "Identity", "LeakyRelu", "Mul", "Pow", "Relu", "Relu6", "Selu",
    "Sigmoid", "Softplus", "Squeeze", "Tanh"})
#: Ops that oneDNN's layout pass may merge with a neighbour: it expects them to have data inputs
#: only and aborts the process (a failed CHECK) on a control input.
MERGE_TARGETS = frozenset({
    "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "BiasAdd", "BiasAddGrad", "Conv2D",
    "Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3D", "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropFilter", "DepthwiseConv2dNativeBackpropInput", "MatMul",
    "MirrorPad", "Pad"})
#: Batch normalisation and its gradients.
NORMS = frozenset({
    "FusedBatchNorm", "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3",
    "FusedBatchNormV2", "FusedBatchNormV3"})
#: What oneDNN fuses into a batch normalisation.
NORM_PARTNERS = frozenset({"Add", "AddV2", "Relu", "Relu6", "Relu6Grad", "ReluGrad"})
#: Ops that cost nothing to run where their consumer runs.
FREE = frozenset({"Const", "Identity", "ReadVariableOp"})

# Collectives that run on a stream of their own (NCCL's on GPUs), beside the compute stream.
COLLECTIVE_TYPES = frozenset({"NcclAllReduce"})
#: Ops that run the script's own code or checks: an error they raise is the script's, the
#: same with or without fastt (a plan moves them, never changes what they compute).
PYTHON = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})  #: ops that call Python
USER_CODE = PYTHON | {"Assert", "CheckNumerics", "CheckNumericsV2"}
#: Ops whose output sizes depend on their input values, not shapes: a shape downstream of
#: them is never known before the step runs, whatever one step measured.
DATA_SIZED = frozenset({
    "DenseToSparseSetOperation", "DynamicPartition", "ListDiff", "NonMaxSuppression",
    "NonMaxSuppressionV2", "NonMaxSuppressionV3", "NonMaxSuppressionV4", "NonMaxSuppressionV5",
    "StringSplit", "StringSplitV2", "Unique", "UniqueV2", "UniqueWithCounts",
    "UniqueWithCountsV2", "Where"})
