import csv, collections, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]
ki = h.index('Kernel Name'); vi = h.index('Metric Value'); ui = h.index('Metric Unit'); gi = h.index('Grid Size')
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    try: v = float(r[vi].replace(',', ''))
    except: continue
    if r[ui] == 'usecond': v *= 1000
    if r[ui] == 'msecond': v *= 1e6
    k = r[ki][:70] + " " + r[gi]; tot[k][0] += 1; tot[k][1] += v
s = sum(v[1] for v in tot.values())
print("kernels", sum(v[0] for v in tot.values()), "total us", round(s / 1000, 1))
for k, v in sorted(tot.items(), key=lambda x: -x[1][1])[:int(sys.argv[2]) if len(sys.argv) > 2 else 22]:
    print(f"{v[1]/1000:8.1f} us {v[0]:4d} x {v[1]/v[0]/1000:7.2f}  {k}")
