// fastt's priority executor: a TensorFlow executor plugin, registered as "FASTT_PRIORITY".
//
// It runs a graph partition with TensorFlow's own building blocks -- ImmutableExecutorState
// (graph and frame structure, kernels), PropagatorState (outputs, frames, iterations, dead
// tensors), the step-stats interface -- and differs from TensorFlow's default executor in one
// thing: ready nodes wait in a priority queue and the highest `_fastt_priority` runs first,
// instead of first come, first served. Nodes without the attribute (transfers and plumbing the
// runtime adds) go before prioritized ones, first come, first served among themselves: they
// are cheap and unblock others.
//
// A session uses it when ConfigProto.experimental.executor_type is "FASTT_PRIORITY".
//
// What it costs per node is kept low the way TensorFlow's executor keeps it low: a partition
// without control flow runs with SimplePropagatorState (atomic pending counts, no frames),
// and a worker that finishes a node making one node ready, more urgent than any queued,
// runs it next without taking the lock (in a chain of ops: no lock at all); otherwise it
// queues what it made ready, counts the node out and takes its next node under one lock.
// benchmarks/executor_overhead.py measures what is left.
#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "tensorflow/core/common_runtime/device.h"
#include "tensorflow/core/common_runtime/entry.h"
#include "tensorflow/core/common_runtime/executor.h"
#include "tensorflow/core/common_runtime/executor_factory.h"
#include "tensorflow/core/common_runtime/graph_view.h"
#include "tensorflow/core/common_runtime/immutable_executor_state.h"
#include "tensorflow/core/common_runtime/local_executor_params.h"
#include "tensorflow/core/common_runtime/propagator_state.h"
#include "tensorflow/core/common_runtime/simple_propagator_state.h"
#include "tensorflow/core/common_runtime/step_stats_collector.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/collective.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/rendezvous.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tensorflow/core/util/tensor_slice_reader_cache.h"
#include "tsl/platform/cpu_info.h"

namespace fastt {
namespace {

namespace tf = ::tensorflow;
using tf::Entry;
using Inputs = absl::InlinedVector<tf::TensorValue, 4>;
using InputAttrs = absl::InlinedVector<tf::AllocatorAttributes, 4>;

constexpr char kExecutorType[] = "FASTT_PRIORITY";
constexpr char kPriorityAttr[] = "_fastt_priority";
constexpr int64_t kUnprioritized = std::numeric_limits<int64_t>::max();

class PriorityExecutor : public tf::Executor {
 public:
  explicit PriorityExecutor(const tf::LocalExecutorParams& params) : immutable_(params) {}

  absl::Status Initialize(const tf::Graph& graph) {
    TF_RETURN_IF_ERROR(immutable_.Initialize(graph));
    priority_.assign(graph.num_node_ids(), kUnprioritized);
    for (const tf::Node* n : graph.nodes()) {
      int64_t p;
      if (tf::TryGetNodeAttr(n->attrs(), kPriorityAttr, &p)) priority_[n->id()] = p;
    }
    return absl::OkStatus();
  }

  const tf::ImmutableExecutorState& immutable() const { return immutable_; }
  int64_t priority(int node_id) const { return priority_[node_id]; }

 private:
  void RunAsyncInternal(const Args& args, DoneCallback done) override;

  tf::ImmutableExecutorState immutable_;
  std::vector<int64_t> priority_;
};

// The propagators' "no node".
template <class P>
typename P::TaggedNode NoNode();
template <>
tf::PropagatorState::TaggedNode NoNode<tf::PropagatorState>() {
  return tf::PropagatorState::TaggedNode(nullptr, nullptr, nullptr, false);
}
template <>
tf::SimplePropagatorState::TaggedNode NoNode<tf::SimplePropagatorState>() {
  return tf::SimplePropagatorState::TaggedNode(nullptr);
}

// A ready node in the queue: highest priority first, then first come, first served.
template <class P>
struct Ready {
  int64_t priority = 0;
  uint64_t seq = 0;
  int64_t scheduled_ns = 0;
  typename P::TaggedNode node = NoNode<P>();
  bool operator<(const Ready& o) const {
    return priority != o.priority ? priority < o.priority : seq > o.seq;
  }
};

// One run of the graph (a step). Deletes itself when the last node is done and no worker,
// async kernel or deferred op still refers to it. P: TensorFlow's PropagatorState where the
// partition has control flow (frames, dead tensors), its SimplePropagatorState where not.
template <class P>
class Step {
  using TaggedNode = typename P::TaggedNode;
  using TaggedNodeSeq = typename P::TaggedNodeSeq;
  using Ready = fastt::Ready<P>;

 public:
  Step(const PriorityExecutor& executor, const tf::Executor::Args& args,
       tf::Executor::DoneCallback done)
      : executor_(executor),
        immutable_(executor.immutable()),
        args_(args),
        device_(immutable_.params().device),
        runner_(args.runner),
        propagator_(immutable_, args.step_id, /*vlog=*/false),
        done_(std::move(done)) {
    if (!device_->TryGetDeviceContext(&device_context_).ok()) device_context_ = nullptr;
    int threads = args.session_config != nullptr
                      ? args.session_config->inter_op_parallelism_threads() : 0;
    max_workers_ = args.run_all_kernels_inline ? 1
                   : threads > 0 ? threads : std::max(1, tsl::port::MaxParallelism());
  }

  ~Step() {
    if (device_context_ != nullptr) device_context_->Unref();
  }

  void Start() {
    TaggedNodeSeq ready;
    propagator_.ActivateRoots(immutable_.root_nodes(), &ready);
    int start;
    bool finish;
    {
      tf::mutex_lock l(mu_);
      pending_ = ready.size();
      start = EnqueueLocked(ready);
      finish = DoneLocked();
    }
    if (finish) {
      Finish();
      return;
    }
    StartWorkers(start);
  }

 private:
  // A kernel's inputs and context parameters: one per worker, reused node after node (what
  // is the same for the whole step is filled once), and one per async kernel run.
  struct Scratch {
    Inputs inputs;
    InputAttrs attrs;
    tf::OpKernelContext::Params params;
  };
  struct AsyncRun : Scratch {
    std::unique_ptr<tf::OpKernelContext> ctx;
  };

  // Queue `nodes`; how many new workers to start for them.
  int EnqueueLocked(const TaggedNodeSeq& nodes) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t now = args_.stats_collector ? tf::Env::Default()->NowNanos() : 0;
    for (const TaggedNode& n : nodes) {
      queue_.push(Ready{executor_.priority(n.node_item->node_id), seq_++, now, n});
    }
    UpdateTopLocked();
    const int want = std::min<int>(queue_.size(), max_workers_) - workers_;
    if (want <= 0) return 0;
    workers_ += want;
    return want;
  }

  // What Inline compares with: the best queued priority.
  void UpdateTopLocked() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    top_.store(queue_.empty() ? std::numeric_limits<int64_t>::min() : queue_.top().priority,
               std::memory_order_release);
  }

  // Each started worker is already counted, so the step outlives these calls.
  void StartWorkers(int n) {
    if (n > 0 && args_.run_all_kernels_inline) {
      Work();  // at most one worker runs inline
      return;
    }
    for (int i = 0; i < n; ++i) runner_([this] { Work(); });
  }

  // A worker: run the best ready node until none is left. Once it has counted itself out
  // it touches nothing: another thread may finish the step.
  void Work() {
    Scratch scratch;
    FillStepParams(&scratch.params);
    Ready r;
    bool finish;
    {
      tf::mutex_lock l(mu_);
      finish = NextLocked(&r);
    }
    while (r.node.node_item != nullptr) {
      TaggedNodeSeq ready;
      absl::Status s;
      int start = 0;
      if (!Process(r, &scratch, &ready, &s)) {  // an async kernel: its callback counts it out
        tf::mutex_lock l(mu_);
        finish = NextLocked(&r);
      } else if (!s.ok()) {
        NodeDone(s, ready);
        tf::mutex_lock l(mu_);
        finish = NextLocked(&r);
      } else if (ready.size() == 1 && Inline(ready[0], &r)) {  // no lock: the next is ready
        continue;
      } else {  // one lock per node
        tf::mutex_lock l(mu_);
        if (status_.ok() && !ready.empty()) {
          pending_ += ready.size();
          start = EnqueueLocked(ready);
        }
        --pending_;
        finish = NextLocked(&r);
      }
      StartWorkers(start);  // this worker or the started ones keep the step alive
    }
    if (finish) Finish();
  }

  // Whether `next` is more urgent than every queued node (and the step has not failed; a
  // tie goes to the queue, first come, first served); then it becomes `r`, the node the calling worker runs next. `pending_` is
  // unchanged: one node done, one made ready.
  bool Inline(const TaggedNode& next, Ready* r) {
    const int64_t p = executor_.priority(next.node_item->node_id);
    if (p <= top_.load(std::memory_order_acquire) || failed_.load(std::memory_order_acquire)) {
      return false;
    }
    r->priority = p;
    r->scheduled_ns = args_.stats_collector ? tf::Env::Default()->NowNanos() : 0;
    r->node = next;
    return true;
  }

  // The calling worker's next node into `r`; where none is left the worker counts itself
  // out (r's node is null) and the result says whether the step just ended. Once the step
  // has failed, queued nodes are dropped.
  bool NextLocked(Ready* r) TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!queue_.empty()) {
      *r = queue_.top();
      queue_.pop();
      UpdateTopLocked();
      if (status_.ok()) return false;
      --pending_;
    }
    *r = Ready();
    --workers_;
    return DoneLocked();
  }

  // Run one node. True when it is done, its status in `s` and the nodes it made ready in
  // `ready`; false when an async kernel took it (its callback finishes it).
  bool Process(const Ready& r, Scratch* scratch, TaggedNodeSeq* ready, absl::Status* s) {
    const TaggedNode& tn = r.node;
    const tf::NodeItem& item = *tn.node_item;
    tf::NodeExecStatsInterface* stats = nullptr;
    if (args_.stats_collector != nullptr && !tn.get_is_dead()) {
      stats = args_.stats_collector->CreateNodeExecStats(&item.kernel->def());
    }
    if (stats != nullptr) {
      stats->SetScheduled(r.scheduled_ns);
      stats->RecordExecutorStarted();
    }
    propagator_.MaybeMarkStarted(tn);
    tf::EntryVector outputs;
    if (tn.get_is_dead() && !item.is_transfer_node) {
      outputs.resize(item.num_outputs);  // a dead node's outputs are dead
    } else {
      Entry* first = propagator_.GetInputTensors(tn);  // this node's inputs
      if (item.kernel_is_async) {
        auto* run = new AsyncRun;
        *s = PrepareInputs(item, first, &run->inputs, &run->attrs);
        if (s->ok()) {
          FillStepParams(&run->params);
          FillNodeParams(&run->params, tn, run->inputs, run->attrs, stats);
          run->ctx = std::make_unique<tf::OpKernelContext>(&run->params, item.num_outputs);
          ComputeAsync(tn, first, stats, run);
          return false;
        }
        delete run;
      } else {
        *s = PrepareInputs(item, first, &scratch->inputs, &scratch->attrs);
        if (s->ok()) {
          FillNodeParams(&scratch->params, tn, scratch->inputs, scratch->attrs, stats);
          tf::OpKernelContext ctx(&scratch->params, item.num_outputs);
          if (stats != nullptr) stats->RecordComputeStarted();
          device_->Compute(item.kernel, &ctx);
          if (stats != nullptr) stats->RecordComputeEnded();
          *s = ProcessOutputs(item, &ctx, &outputs, stats);
        }
      }
      ClearInputs(first, item.num_inputs);
    }
    Complete(tn, *s, &outputs, stats, ready);
    return true;
  }

  void ComputeAsync(const TaggedNode& tn, Entry* first, tf::NodeExecStatsInterface* stats,
                    AsyncRun* run) {
    tf::AsyncOpKernel* kernel = tn.node_item->kernel->AsAsync();
    if (stats != nullptr) stats->RecordComputeStarted();
    device_->ComputeAsync(kernel, run->ctx.get(), [this, tn, first, stats, run]() {
      if (stats != nullptr) stats->RecordComputeEnded();
      tf::EntryVector outputs;
      absl::Status s = ProcessOutputs(*tn.node_item, run->ctx.get(), &outputs, stats);
      delete run;
      ClearInputs(first, tn.node_item->num_inputs);
      TaggedNodeSeq ready;
      Complete(tn, s, &outputs, stats, &ready);
      NodeDone(s, ready);
    });
  }

  // Propagate a finished node's outputs; the nodes they make ready go to `ready`.
  void Complete(const TaggedNode& tn, const absl::Status& s, tf::EntryVector* outputs,
                tf::NodeExecStatsInterface* stats, TaggedNodeSeq* ready) {
    if (s.ok()) {
      propagator_.MaybeMarkCompleted(tn);
      propagator_.PropagateOutputs(tn, outputs, ready);
    }
    if (stats != nullptr) {
      stats->RecordExecutorEnded();
      stats->Done(device_->name());  // the collector takes it
    }
  }

  absl::Status PrepareInputs(const tf::NodeItem& item, Entry* first, Inputs* inputs,
                             InputAttrs* attrs) {
    static tf::Tensor* const kNoInput = new tf::Tensor();
    inputs->resize(item.num_inputs);
    attrs->resize(item.num_inputs);
    for (int i = 0; i < item.num_inputs; ++i) {
      Entry* e = first + i;
      tf::TensorValue* in = &(*inputs)[i];
      *in = tf::TensorValue();  // the vectors are reused: no tensor left from another node
      const bool expect_ref = tf::IsRefType(item.input_type(i));
      (*attrs)[i] = e->alloc_attr;
      switch (e->state) {
        case Entry::State::NO_VALUE:  // a Merge's missing input, or a dead transfer
          if (!item.is_merge) in->tensor = kNoInput;
          break;
        case Entry::State::HAS_VALUE:
        case Entry::State::HAS_CONST_TENSOR:
          if (expect_ref) {
            return tf::errors::InvalidArgument(
                i, "-th input of ", tf::FormatNodeDefForError(item.kernel->def()),
                " expects a reference, got a value");
          }
          in->tensor = e->state == Entry::State::HAS_VALUE
                           ? e->val.get() : const_cast<tf::Tensor*>(e->const_tensor);
          break;
        case Entry::State::HAS_REF_TENSOR: {
          tf::Tensor* ref = e->ref_tensor.tensor;
          tf::mutex* mu = e->ref_tensor.mu;
          {
            tf::tf_shared_lock l(*mu);
            if (!ref->IsInitialized() && !item.is_initialization_op) {
              return tf::errors::FailedPrecondition(
                  "Attempting to use uninitialized value ", item.kernel->requested_input(i));
            }
          }
          if (expect_ref) {
            in->mutex_if_ref = mu;
            in->tensor = ref;
          } else {  // read the variable now: the value may change later
            {
              tf::tf_shared_lock l(*mu);
              e->val.Init(*ref);
            }
            e->state = Entry::State::HAS_VALUE;
            in->tensor = e->val.get();
          }
          break;
        }
      }
    }
    return absl::OkStatus();
  }

  // The kernel context parameters that are the same for every node of the step.
  void FillStepParams(tf::OpKernelContext::Params* p) {
    p->step_id = args_.step_id;
    p->start_time_usecs = args_.start_time_usecs;
    p->deadline = args_.deadline;
    p->device = device_;
    p->resource_manager = device_->resource_manager();
    p->step_container = args_.step_container;
    p->rendezvous = args_.rendezvous;
    p->collective_executor = args_.collective_executor;
    p->session_config = args_.session_config;
    p->session_state = args_.session_state;
    p->session_handle = args_.session_handle;
    p->session_metadata = immutable_.params().session_metadata;
    p->tensor_store = args_.tensor_store;
    p->cancellation_manager = args_.cancellation_manager;
    p->op_device_context = device_context_;
    p->call_frame = args_.call_frame;
    p->function_library = immutable_.params().function_library;
    p->runner = &runner_;
    p->stats_collector = args_.stats_collector;
    p->run_all_kernels_inline = args_.run_all_kernels_inline;
    p->slice_reader_cache = &slice_reader_cache_;
    p->inc_num_deferred_ops_function = [this] {
      tf::mutex_lock l(mu_);
      ++deferred_;
    };
    p->dec_num_deferred_ops_function = [this] {
      bool finish;
      {
        tf::mutex_lock l(mu_);
        --deferred_;
        finish = DoneLocked();
      }
      if (finish) Finish();
    };
    p->stack_trace = args_.stack_trace;
    p->coordination_service_agent = args_.coordination_service_agent;
  }

  // The kernel context parameters of one node.
  void FillNodeParams(tf::OpKernelContext::Params* p, const TaggedNode& tn,
                      const Inputs& inputs, const InputAttrs& attrs,
                      tf::NodeExecStatsInterface* stats) {
    const tf::NodeItem& item = *tn.node_item;
    p->op_kernel = item.kernel;
    p->track_allocations = stats != nullptr && stats->TrackAllocations();
    p->output_attr_array = item.output_attrs();
    p->forward_from_array = item.forward_from();
    p->outputs_required_array = item.outputs_required.get();
    p->inputs = absl::MakeConstSpan(inputs);
    p->input_alloc_attrs = absl::MakeConstSpan(attrs);
    p->is_input_dead = tn.get_is_dead();
    p->frame_iter = propagator_.GetFrameAndIter(tn);
  }

  absl::Status ProcessOutputs(const tf::NodeItem& item, tf::OpKernelContext* ctx,
                              tf::EntryVector* outputs, tf::NodeExecStatsInterface* stats) {
    absl::Status s = ctx->status();
    if (!s.ok()) return tf::AttachDef(s, item.kernel->def());
    outputs->resize(item.num_outputs);
    for (int i = 0; i < item.num_outputs; ++i) {
      const tf::TensorValue val = ctx->release_output(i);
      if (val.tensor == nullptr) {
        const bool optional = item.is_recv_or_switch ||
            (item.outputs_required != nullptr && !item.outputs_required[i]);
        if (!optional) {
          s.Update(tf::errors::Internal("Missing ", i, "-th output from ",
                                        tf::FormatNodeDefForError(item.kernel->def())));
        }
        continue;
      }
      Entry* out = &(*outputs)[i];
      const tf::DataType dtype = val.dtype_safe();  // a reference type for a ref output
      if (dtype != item.output_type(i)) {
        s.Update(tf::errors::Internal(
            "Output ", i, " of type ", tf::DataTypeString(dtype),
            " does not match declared output type ", tf::DataTypeString(item.output_type(i)),
            " for node ", tf::FormatNodeDefForError(item.kernel->def())));
        if (!val.is_ref()) delete val.tensor;
        continue;
      }
      out->alloc_attr = ctx->output_alloc_attr(i);
      if (stats != nullptr) stats->SetOutput(i, val.tensor);
      if (val.is_ref()) {
        out->state = Entry::State::HAS_REF_TENSOR;
        out->ref_tensor.tensor = val.tensor;
        out->ref_tensor.mu = val.mutex_if_ref;
      } else {
        out->state = Entry::State::HAS_VALUE;
        out->val.Init(std::move(*val.tensor));
        delete val.tensor;
      }
    }
    if (stats != nullptr && stats->TrackAllocations()) stats->SetMemory(ctx);
    return s;
  }

  static void ClearInputs(Entry* first, int n) {
    for (int i = 0; i < n; ++i) first[i].ClearVal();
  }

  // A node finished with `s` outside a worker's fast path (an async kernel's callback, a
  // failure); `ready` are the nodes it made ready. The node counts as pending until the end,
  // which keeps the step alive while this runs.
  void NodeDone(const absl::Status& s, const TaggedNodeSeq& ready) {
    bool abort = false;
    int start = 0;
    {
      tf::mutex_lock l(mu_);
      if (!s.ok() && status_.ok()) {
        status_ = s;
        abort = true;
        failed_.store(true, std::memory_order_release);
      }
      if (status_.ok() && !ready.empty()) {
        pending_ += ready.size();
        start = EnqueueLocked(ready);
      }
    }
    if (abort) {
      if (args_.rendezvous != nullptr) args_.rendezvous->StartAbort(s);
      if (args_.cancellation_manager != nullptr) {
        args_.cancellation_manager->StartCancel();
      } else if (args_.collective_executor != nullptr) {
        args_.collective_executor->StartAbort(s);
      }
    }
    StartWorkers(start);
    bool finish;
    {
      tf::mutex_lock l(mu_);
      --pending_;
      finish = DoneLocked();
    }
    if (finish) Finish();
  }

  // Whether the step just ended: nothing pending, running or deferred. True once.
  bool DoneLocked() TF_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || pending_ > 0 || workers_ > 0 || deferred_ > 0) return false;
    finished_ = true;
    return true;
  }

  void Finish() {
    absl::Status s;
    {
      tf::mutex_lock l(mu_);
      s = status_;
    }
    if (s.ok() && args_.sync_on_finish) s = device_->Sync();
    tf::Executor::DoneCallback done = std::move(done_);
    delete this;
    done(s);
  }

  const PriorityExecutor& executor_;
  const tf::ImmutableExecutorState& immutable_;
  const tf::Executor::Args args_;
  tf::Device* const device_;
  tf::DeviceContext* device_context_ = nullptr;
  tf::Executor::Args::Runner runner_;
  P propagator_;
  tf::checkpoint::TensorSliceReaderCacheWrapper slice_reader_cache_;
  tf::Executor::DoneCallback done_;
  int max_workers_ = 1;

  tf::mutex mu_;
  std::priority_queue<Ready> queue_ TF_GUARDED_BY(mu_);
  uint64_t seq_ TF_GUARDED_BY(mu_) = 0;
  int64_t pending_ TF_GUARDED_BY(mu_) = 0;  // nodes queued or running
  int workers_ TF_GUARDED_BY(mu_) = 0;      // worker loops started and not returned
  int deferred_ TF_GUARDED_BY(mu_) = 0;     // deferred ops of kernels not yet done
  bool finished_ TF_GUARDED_BY(mu_) = false;
  absl::Status status_ TF_GUARDED_BY(mu_);
  std::atomic<int64_t> top_{std::numeric_limits<int64_t>::min()};  // see UpdateTopLocked
  std::atomic<bool> failed_{false};  // status_ is not ok
};

void PriorityExecutor::RunAsyncInternal(const Args& args, DoneCallback done) {
  if (immutable_.requires_control_flow_support()) {
    (new Step<tf::PropagatorState>(*this, args, std::move(done)))->Start();
  } else {
    (new Step<tf::SimplePropagatorState>(*this, args, std::move(done)))->Start();
  }
}

class PriorityExecutorFactory : public tf::ExecutorFactory {
 public:
  absl::Status NewExecutor(const tf::LocalExecutorParams& params, const tf::Graph& graph,
                           std::unique_ptr<tf::Executor>* out) override {
    auto executor = std::make_unique<PriorityExecutor>(params);
    TF_RETURN_IF_ERROR(executor->Initialize(graph));
    *out = std::move(executor);
    return absl::OkStatus();
  }
};

const bool kRegistered = [] {
  tf::ExecutorFactory::Register(kExecutorType, new PriorityExecutorFactory);
  return true;
}();

}  // namespace
}  // namespace fastt

// The TensorFlow this was compiled against (setup.py passes tf.__version__); fastt reads it
// from the file before it loads the library.
#ifndef FASTT_TF_VERSION
#define FASTT_TF_VERSION "unknown"
#endif
extern "C" __attribute__((visibility("default"), used))
const char fastt_priority_executor_built_for[] = "FASTT_BUILT_FOR_TF=" FASTT_TF_VERSION ";";
