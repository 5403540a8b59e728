module memdiag.test/workloads

go 1.19
