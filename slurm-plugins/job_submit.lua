--[[
hpcsched's job_submit plugin for Slurm (JobSubmitPlugins=lua; Debian's slurmctld ships
job_submit_lua.so). Install: copy this file as job_submit.lua into the directory of slurm.conf,
optionally with job_submit_hpcsched.conf beside it, and restart slurmctld (docs/slurm-plugins.md).

For every submitted job it:
  * recognises hpcsched's jobs: an hpcsub batch script carries a line
      #HPCSCHED job=<uid> min_gpus=<n> max_gpus=<n> max_nodes=<n>
    (jobscripts/hpcsched-job.sbatch), an extension job the comment
      hpcsched-extension:<primary job>:<uid>:g<generation>
    and tags them in AdminComment ("hpcsched:elastic job=<uid> max_gpus=<n>",
    "hpcsched:extension of <primary>"), which only Slurm operators can set, so squeue, sacct and
    prometheus-slurm-exporter can tell elastic work from the rest. Other jobs pass untouched.
  * with extension_qos set, puts extension jobs in that QOS (preemptible, so that Slurm starts
    other jobs on lent GPUs at once; the job's workers leave at a step boundary on SIGTERM).
  * enforces the partition's limits for elastic jobs, counted at the largest size the job may
    grow to (Slurm only sees the size it starts at): the partition's own MaxNodes, and the
    settings max_gpus / max_time of job_submit_hpcsched.conf (for all partitions, or
    partition.<name>.max_gpus / .max_time). A job over a limit is refused with a message
    that says which limit and how to fit it; a job without a time limit gets max_time.
  * with submit_stamp set, rewrites that file at every submission that is not hpcsched's: the
    daemon ([daemon] submit_stamp, the same path) sees it change and looks at once for another
    user's pending job that lent GPUs should go back to, rather than at its next event_poll.
  * with hold_seconds > 0, holds a new elastic job for the daemon's placement: its begin time
    is set hold_seconds ahead (squeue shows Reason=BeginTime). The daemon places it and starts it
    with StartTime=now within one round; if no daemon runs, Slurm itself starts it when the begin
    time passes, so no job is left held. A job that asked for its own --begin keeps it.

Settings (job_submit_hpcsched.conf, "key = value" lines, "#" comments; every key optional):
  hold_seconds = 0                 -- 0: elastic jobs start at once
  max_gpus = 64                    -- every partition: GPUs at the largest size
  max_time = 1440                  -- every partition: minutes
  partition.gpu.max_gpus = 16      -- one partition (overrides the above)
  partition.gpu.max_time = 720
  extension_qos = hpcsched-lend    -- extension jobs run in this QOS (a name; unset: the
                                   -- primary's). Make it preemptible by the others
                                   -- (PreemptType=preempt/qos, GraceTime) and Slurm itself
                                   -- gives lent GPUs back to other jobs (docs/daemon.md)
  submit_stamp = /run/hpcsched/submitted
                                   -- a file slurmctld's user may write and the daemon read
                                   -- (unset: none); the daemon's [daemon] submit_stamp

Slurm's interface: https://slurm.schedmd.com/job_submit_plugins.html (job_desc fields,
slurm.log_user, slurm.SUCCESS / slurm.ERROR).
]]

local CONFIG_NAME = "job_submit_hpcsched.conf"
local NO_VAL = 4294967294          -- Slurm's NO_VAL: a field the user did not set
local INFINITE = 4294967295

-- ------------------------------------------------------------------------------ settings
local function script_dir()
    local src = debug.getinfo(1, "S").source
    return src:match("^@(.*)/[^/]*$") or "."
end

local function read_settings()
    local settings = {}
    local path = script_dir() .. "/" .. CONFIG_NAME
    local f = io.open(path, "r")
    if f == nil then
        return settings
    end
    local n = 0
    for line in f:lines() do
        n = n + 1
        local text = line:gsub("#.*$", ""):gsub("%-%-.*$", "")
        if text:match("%S") then
            local key, value = text:match("^%s*([%w%._%-]+)%s*=%s*(%d+)%s*$")
            local name_key, name = text:match("^%s*(extension_qos)%s*=%s*([%w%._%-]+)%s*$")
            local path_key, path_value = text:match("^%s*(submit_stamp)%s*=%s*(/[%w%._%-/]+)%s*$")
            if name_key ~= nil then
                settings[name_key] = name
            elseif path_key ~= nil then
                settings[path_key] = path_value
            elseif key == nil then
                slurm.log_error("hpcsched job_submit: %s line %d ignored (want 'key = number'): %s",
                                path, n, line)
            else
                settings[key] = tonumber(value)
            end
        end
    end
    f:close()
    return settings
end

local function limit(settings, partition, key)
    if partition ~= nil then
        local v = settings["partition." .. partition .. "." .. key]
        if v ~= nil then
            return v
        end
    end
    return settings[key]
end

-- ------------------------------------------------------------------------------ recognising
local function hpcsub_tag(script)
    if script == nil then
        return nil
    end
    local line = script:match("\n#HPCSCHED ([^\n]*)")
    if line == nil then
        return nil
    end
    local tag = {}
    for k, v in line:gmatch("([%w_]+)=([%w%-_]+)") do
        tag[k] = v
    end
    if tag.job == nil then
        return nil
    end
    tag.min_gpus = tonumber(tag.min_gpus)
    tag.max_gpus = tonumber(tag.max_gpus)
    tag.max_nodes = tonumber(tag.max_nodes)
    return tag
end

local function extension_of(comment)
    if comment == nil then
        return nil
    end
    return comment:match("^hpcsched%-extension:(%d+):")
end

local function partition_record(job_desc, part_list)
    local want = job_desc.partition
    for _, part in pairs(part_list) do
        if (want ~= nil and part.name == want) or (want == nil and part.flag_default == 1) then
            return part
        end
    end
    return nil
end

-- ------------------------------------------------------------------------------ limits
local function check_limits(job_desc, tag, settings, part)
    local name = job_desc.partition or (part and part.name)
    local where = name and ("partition " .. name) or "the default partition"
    if part ~= nil and tag.max_nodes ~= nil and part.max_nodes ~= nil
            and part.max_nodes ~= INFINITE and part.max_nodes ~= NO_VAL
            and tag.max_nodes > part.max_nodes then
        return string.format("hpcsched: this elastic job may grow to %d nodes, but %s allows " ..
            "at most %d (MaxNodes); submit with --hpcsched-max-nodes %d or less",
            tag.max_nodes, where, part.max_nodes, part.max_nodes)
    end
    local max_gpus = limit(settings, name, "max_gpus")
    if max_gpus ~= nil and tag.max_gpus ~= nil and tag.max_gpus > max_gpus then
        return string.format("hpcsched: this elastic job may grow to %d GPUs, but elastic jobs " ..
            "in %s may hold at most %d; lower --hpcsched-max-nodes (or --hpcsched-max-gpus)",
            tag.max_gpus, where, max_gpus)
    end
    local max_time = limit(settings, name, "max_time")
    if max_time ~= nil then
        local t = job_desc.time_limit
        if t == nil or t == NO_VAL or t == INFINITE then
            job_desc.time_limit = max_time
            slurm.log_user("hpcsched: no --time given; elastic jobs in %s get %d minutes",
                           where, max_time)
        elseif t > max_time then
            return string.format("hpcsched: --time is %d minutes, but elastic jobs in %s may " ..
                "run at most %d minutes; submit with --time=%d or less", t, where, max_time,
                max_time)
        end
    end
    return nil
end

-- ------------------------------------------------------------------------------ the stamp
local function stamp(settings)
    local path = settings.submit_stamp
    if path == nil then
        return
    end
    local f = io.open(path, "w")
    if f == nil then
        slurm.log_error("hpcsched job_submit: cannot write submit_stamp %s", path)
        return
    end
    f:write(tostring(os.time()), "\n")
    f:close()
end

-- ------------------------------------------------------------------------------ Slurm's calls
function slurm_job_submit(job_desc, part_list, submit_uid)
    local primary = extension_of(job_desc.comment)
    if primary ~= nil then
        job_desc.admin_comment = "hpcsched:extension of " .. primary
        local qos = read_settings().extension_qos
        if qos ~= nil then
            job_desc.qos = qos     -- lent GPUs: Slurm preempts them for other jobs
        end
        return slurm.SUCCESS
    end
    local tag = hpcsub_tag(job_desc.script)
    if tag == nil then
        stamp(read_settings())     -- another user's job: the daemon looks now
        return slurm.SUCCESS
    end
    local settings = read_settings()
    local refused = check_limits(job_desc, tag, settings, partition_record(job_desc, part_list))
    if refused ~= nil then
        slurm.log_info("hpcsched job_submit: refused job %s of uid %d: %s", tag.job,
                       submit_uid, refused)
        slurm.log_user("%s", refused)
        return slurm.ERROR
    end
    local comment = string.format("hpcsched:elastic job=%s max_gpus=%s", tag.job,
                                  tostring(tag.max_gpus or "?"))
    local hold = settings.hold_seconds or 0
    local begin = job_desc.begin_time
    if hold > 0 and (begin == nil or begin == 0 or begin == NO_VAL) then
        job_desc.begin_time = os.time() + hold
        comment = comment .. string.format(" hold=%d", hold)
    end
    job_desc.admin_comment = comment
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

slurm.log_info("hpcsched job_submit.lua loaded")
return slurm.SUCCESS
