// The per-call path, part 2: which specialization fits, or why none does.
#include "check.h"
#include "op.h"
#include "util.h"

namespace flyship {

bool Decider::fits(const Call& c, int si, const Selection& sel, bool is_out, std::string* why,
                   LaunchShape* ls) const {
  const OpPlan& p = plan_;
  const SpecPlan& s = p.specs[si];
  const int vi = sel.variant[index_][si];
  if (vi == -1) {
    if (why) *why = sel.reason[index_][si];
    return false;
  }
  for (const auto& [slot, dt] : s.dtypes) {
    if (c.t[slot]->scalar_type() != dt) {
      if (why) *why = "dtype " + p.slots[slot].name + "=" + dtype_name(c.t[slot]->scalar_type());
      return false;
    }
  }
  for (const auto& [slot, align] : s.alignment) {
    if (c.t[slot] == nullptr) continue;  // a fresh output: the allocator aligns it
    if (reinterpret_cast<uintptr_t>(c.t[slot]->data_ptr()) % static_cast<uintptr_t>(align) != 0) {
      if (why) *why = "alignment " + p.slots[slot].name + " not " + std::to_string(align) + "-byte aligned";
      return false;
    }
  }
  auto holds = [&](const Program& prog) {
    int64_t v = 0;
    const EvalStatus st = evaluate(prog.code, c, &v);
    if (st != EvalStatus::kOk) {
      if (why) *why = "constraint '" + prog.text + "' " + describe(st);
      return false;
    }
    if (v == 0) {
      if (why) *why = "constraint '" + prog.text + "' false";
      return false;
    }
    return true;
  };
  for (const Program& prog : s.constraints)
    if (!holds(prog)) return false;
  if (is_out) {
    for (const Program& prog : s.out_constraints)
      if (!holds(prog)) return false;
  }
  if (vi == kOnPurpose) return true;  // the reference, on purpose: no launch to check
  LaunchShape local;
  LaunchShape* first = ls ? ls : &local;
  const VariantPlan& v = s.variants[vi];
  if (!packer_.check_launch(v, c, first, why)) return false;
  return (v.then.empty() && v.workspaces.empty()) || packer_.check_following(v, c, *first, why);
}

Decision Decider::decide(const Call& c, const Selection& sel, bool is_out) const {
  Decision d;
  const int n = static_cast<int>(plan_.specs.size());
  for (int s = 0; s < n; ++s) {
    if (fits(c, s, sel, is_out, nullptr, &d.launch)) {
      d.variant = sel.variant[index_][s];
      if (d.variant == kOnPurpose) {
        d.on_purpose = true;
        d.reason = sel.reason[index_][s];
      } else {
        d.spec = s;
      }
      return d;
    }
  }
  // Nothing fits: say why, once per specialization (the slow path only).
  std::vector<std::string> whys;
  bool all_same = true;
  for (int s = 0; s < n; ++s) {
    std::string why;
    fits(c, s, sel, is_out, &why, nullptr);
    if (!whys.empty() && why != whys.front()) all_same = false;
    whys.push_back(why);
  }
  if (n == 0) {
    d.reason = "the op has no specializations";
  } else if (all_same) {
    d.reason = whys.front();
  } else {
    std::vector<std::string> parts;
    for (int s = 0; s < n; ++s) parts.push_back(plan_.specs[s].name + ": " + whys[s]);
    d.reason = join(parts, "; ");
  }
  return d;
}

}  // namespace flyship
