// Opt-in alert rules (main.bicep alertsEnabled): messages dead-lettered, and forwarders whose
// Heartbeat stopped.
//
// Dead letters: a metric alert on the namespace's DeadletteredMessages (the count in the
// dead-letter queues, a gauge), one time series per entity. Azure Monitor reports it per queue
// and per topic, not per subscription: the topic's series sums every subscription's dead-letter
// queue, the audit subscription's included (its messages expire there after 7 days unless
// someone drains it). The alert stays fired while anything sits in a dead-letter queue and
// resolves when it is drained.
//
// Heartbeats: a log alert over the invocation lines the Function App writes to Application
// Insights (functions/shared/invocations.py). Every forwarder's Heartbeat reaches the
// approval-gate function, whose line names the VM; a VM whose last such line is older than
// heartbeatStaleSeconds fires, one alert per VM (dimension vmName). Why these lines and not the
// gate's heartbeat blobs: they exist whether or not the acknowledge fallback is on, need no code
// that reads the blobs on a timer, and are the same data the queries in docs/monitoring.md read. A VM silent
// for longer than the two-day look-back drops out (a decommissioned VM stops alerting by
// itself); one that never sent a Heartbeat is not known here.

@description('Azure region of the log alert (metric alerts are global).')
param location string

@description('Prefix of the alert rules\' names.')
param namePrefix string

@description('Name of the Service Bus namespace.')
param namespaceName string

@description('Name of the scheduled-events topic.')
param topicName string

@description('Name of the approvals queue.')
param approvalsQueueName string

@description('Name of the Application Insights component the Function App logs to.')
param appInsightsName string

@description('A forwarder whose last Heartbeat is older than this (seconds) fires the heartbeat alert.')
@minValue(60)
param heartbeatStaleSeconds int = 900

@description('The dead-letter alert fires when an entity\'s dead-letter count exceeds this.')
@minValue(0)
param deadLetterThreshold int = 0

@description('Resource ids of the action groups to notify; empty: the alerts show in the portal only.')
param actionGroupIds array = []

@description('Tags for every resource.')
param tags object = {}

// The line's prefix (functions/shared/invocations.py INVOCATION_PREFIX); the JSON follows it.
var invocationPrefix = 'sebridge.invocation '

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${namePrefix}-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages sit in the dead-letter queue of the ${topicName} topic (any subscription, audit included) or of the ${approvalsQueueName} queue.'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'dead-lettered'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                topicName
                approvalsQueueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: deadLetterThreshold
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [for id in actionGroupIds: {
      actionGroupId: id
    }]
  }
}

resource heartbeatStopped 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = {
  name: '${namePrefix}-heartbeat-stopped'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: '${namePrefix}-heartbeat-stopped'
    description: 'A forwarder sent no Heartbeat for more than ${heartbeatStaleSeconds} seconds (one alert per VM).'
    severity: 2
    enabled: true
    scopes: [
      appInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    // The query needs each VM's last Heartbeat, which may be older than the window.
    overrideQueryTimeRange: 'P2D'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: 'traces | where message startswith "${invocationPrefix}" | extend line = parse_json(substring(message, strlen("${invocationPrefix}"))) | where tostring(line.transition) == "Heartbeat" | extend vmName = tolower(tostring(line.vmName)) | where isnotempty(vmName) | summarize lastHeartbeat = max(timestamp) by vmName | where lastHeartbeat < ago(${heartbeatStaleSeconds}s)'
          timeAggregation: 'Count'
          operator: 'GreaterThan'
          threshold: 0
          dimensions: [
            {
              name: 'vmName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: actionGroupIds
    }
  }
}

@description('Resource id of the dead-letter metric alert.')
output deadLetterAlertId string = deadLetters.id

@description('Resource id of the heartbeat log alert.')
output heartbeatAlertId string = heartbeatStopped.id
